"""The one error type a user sees for a bad model folder or an unusable setup.

Messages are one line and name the file and the problem, so the window and the CLI can show them as is.
"""


class ModelError(Exception):
    """A model folder (or a device) we cannot use; str(err) is the user-facing one-line message."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class ContextFullError(ModelError):
    """The prompt alone does not fit in the configured context length."""


def check_room(n_prompt: int, settings, ctx: int) -> None:
    """For a request whose max_new_tokens was asked for (settings.length_strict): ContextFullError where the
    prompt and those tokens overflow the context, said with the numbers as OpenAI says it."""
    if (
        getattr(settings, "length_strict", False)
        and settings.max_new_tokens is not None
        and n_prompt + settings.max_new_tokens > ctx
    ):
        asked = n_prompt + settings.max_new_tokens
        raise ContextFullError(
            f"this model's maximum context length is {ctx} tokens, but {asked} were asked for "
            f"({n_prompt} in the messages, {settings.max_new_tokens} in the completion); "
            "shorten the messages or lower max_tokens"
        )


class OutOfMemoryError(ModelError):
    """The GPU ran out of memory while loading or generating."""


class GpuMissingError(ModelError):
    """A GPU asked for by number ("cuda:N") that this machine doesn't have now."""

    def __init__(self, message: str, index: int, count: int):
        super().__init__(message)
        self.index, self.count = index, count


class GpuUnsupportedError(ModelError):
    """The installed torch has no GPU code for this GPU (model_loader.gpu_support): the CPU still works."""
