"""The one exception type the CLI turns into a single line and a non-zero exit."""


class AnimaError(Exception):
    """A problem the user can fix (bad file, bad option); its message is the whole story."""
