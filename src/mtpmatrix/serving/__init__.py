"""sglang servers: launch one on 127.0.0.1 in its own process group, wait for it, talk to it over HTTP, stop
it; how many launch side by side; the machine's GPUs and installed releases. Used by the tiers and the
runner; imports only mtpmatrix.core."""
