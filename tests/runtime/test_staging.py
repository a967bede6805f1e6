"""HostStager.upload: one buffer, one view per list, every view 16-byte aligned."""

from __future__ import annotations

import torch

from pdserve.runtime.staging import ALIGN, HostStager


def test_upload_views_hold_the_lists_at_aligned_offsets() -> None:
    parts = [[1, 2, 3], [], [4], [5, 6, 7, 8, 9], [10, 11]]
    dev, host = HostStager(torch.device("cpu")).upload(parts)
    for p, d, h in zip(parts, dev, host):
        assert d.tolist() == p and h.tolist() == p
        assert d.dtype == torch.int32
        # Triton specializes pointers on 16-byte alignment: lengths must not shift the views
        assert d.storage_offset() % ALIGN == 0 and ALIGN * d.element_size() == 16
    assert dev[-1].untyped_storage().data_ptr() == dev[0].untyped_storage().data_ptr()  # one buffer
