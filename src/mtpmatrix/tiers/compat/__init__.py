"""What differs between sglang releases, as the contract and smoke tiers need it: ServerArgs resolution and
imports, sglang's own loader on CPU, the speculative meta_info fields, the native-extension ABI."""
