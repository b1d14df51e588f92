"""gemma4-mtp-matrix: qualification matrix for SGLang's Gemma 4 Frozen-KV MTP path."""

__version__ = "0.1.0"
