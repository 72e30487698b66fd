"""`one_torch_thread` holds torch to one thread for its block and gives the count back."""

from __future__ import annotations

import pytest

from atroposlib.utils.torch_threads import one_torch_thread

torch = pytest.importorskip("torch")


def test_one_thread_inside_and_the_count_back_after_even_on_an_error():
    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_torch_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), one_torch_thread():
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)
