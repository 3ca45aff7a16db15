"""Trinity-RFT's config sections a workflow reads from its ``Task``: ours, by the same names
and fields (``schemas.config``)."""

from schemas.config import FormatConfig, GenerationConfig

__all__ = ["FormatConfig", "GenerationConfig"]
