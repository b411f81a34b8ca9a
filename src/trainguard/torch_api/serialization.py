"""Where a ``torch.save``'d tensor's bytes lie in its file, so a reader can put them straight into its own memory.

``torch.load(..., map_location="meta")`` reads only the zip's records (a few KB) and gives a meta tensor
whose storage carries the byte offset of its data (``_checkpoint_offset``, private, set since torch 2.7;
torch's own experimental checkpoint reader reads tensors this way). Without it the caller loads as usual.
"""

from __future__ import annotations

import io
from typing import IO, cast

import torch


def saved_tensor_layout(stream: io.IOBase) -> tuple[torch.Tensor, int] | None:
    """(meta tensor, offset of its first byte in ``stream``) of the tensor saved in ``stream``; None when the
    item is not one tensor or this torch does not say where its bytes are."""
    meta = torch.load(cast(IO[bytes], stream), map_location="meta", weights_only=True)
    if not isinstance(meta, torch.Tensor) or type(meta) is not torch.Tensor:
        return None
    offset = getattr(meta.untyped_storage(), "_checkpoint_offset", None)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return None
    return meta, offset + meta.storage_offset() * meta.element_size()
