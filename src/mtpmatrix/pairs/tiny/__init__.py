"""The tiny, shape-true Gemma 4 target + MTP assistant pairs every variant shares, generated offline (no Hugging Face
access needed). A module per part:

- ``configs``: the three families' config.json templates (target and assistant) and the variants' changes to them;
- ``vocab``: the token ids, the byte-fallback tokenizer and the processor written with every pair;
- ``checkpoint``: the models instantiated from the templates, the variant's construction written into them, saved as
  bf16 safetensors;
- ``build``: a pair's folder under a root, built once into a temp dir and renamed into place, its marker and hash.

The constructions themselves are modules of ``mtpmatrix.pairs`` (plus_one, witness, decoy, sampled, long_witness).
"""
