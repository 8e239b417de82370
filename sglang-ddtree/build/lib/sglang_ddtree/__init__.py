"""DDTree (Diffusion Draft Tree) speculative decoding: tree build, verification walks, SGLang plugin."""

__version__ = "0.1.0"
