"""Which device an encoder takes when none is given, and that a machine without a GPU decides it without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retrieval_server.encoders import torch_encoder
from retrieval_server.encoders.torch_encoder import resolve_device


def test_a_given_device_is_kept():
    assert resolve_device("cuda:1") == "cuda:1"


def test_no_gpu_device_file_means_cpu_without_importing_torch(tmp_path):
    script = (
        "import sys\n"
        "from retrieval_server.encoders import torch_encoder\n"
        f"torch_encoder.GPU_DEVICE_FILES = ({str(tmp_path / 'nvidia0')!r},)\n"
        "print(torch_encoder.resolve_device(None), 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "False"]


def test_hidden_gpus_mean_cpu(monkeypatch, tmp_path):
    present = tmp_path / "nvidiactl"
    present.touch()
    monkeypatch.setattr(torch_encoder, "GPU_DEVICE_FILES", (str(present),))
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert resolve_device(None) == "cpu"


def test_with_a_gpu_device_file_torch_decides(monkeypatch, tmp_path):
    import torch

    present = tmp_path / "nvidiactl"
    present.touch()
    monkeypatch.setattr(torch_encoder, "GPU_DEVICE_FILES", (str(present),))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu"


@pytest.mark.parametrize("value", ["0", "0,1"])
def test_visible_gpus_are_asked_of_torch(monkeypatch, tmp_path, value):
    import torch

    present = tmp_path / "nvidia0"
    present.touch()
    monkeypatch.setattr(torch_encoder, "GPU_DEVICE_FILES", (str(present),))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"


def test_a_container_given_one_numbered_gpu_file_still_asks_torch(monkeypatch, tmp_path):
    import torch

    (tmp_path / "nvidia3").touch()  # no nvidia0, no nvidiactl in this directory
    monkeypatch.setattr(torch_encoder, "GPU_DEVICE_FILES", (str(tmp_path / "nvidia[0-9]*"),))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"
