"""r1desk's model side: locate, validate and load Qwen2 checkpoints and generate with them.

Never imports Qt. The desktop worker imports this package on its own thread (importing torch takes
seconds), so keep module import free of work: no torch global settings are changed at import time.
"""

from model_loader.errors import ModelError

__all__ = ["ModelError"]
