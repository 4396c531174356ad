# Writes the torch.save files in this folder with real PyTorch (Debian's
# python3-torch, PyTorch 1.13). Run from this folder: python3 make_fixtures.py
# The numbers are made up; the files exist to pin the archive layout.
import torch

base = torch.arange(12, dtype=torch.int16).reshape(3, 4)
shared = torch.arange(10, dtype=torch.int64)
torch.save(
    {
        "ints": [0, 255, 256, 65535, 65536, -1, -(2**31), 2**31, 2**40, -(2**40)],
        "text": "h\u00e9llo",
        "flag": True,
        "none": None,
        "real": 1.5,
        "pair": (1, "two"),
        "t64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "t32": torch.tensor([[-1, 2], [3, -4]], dtype=torch.int32),
        "transposed": base.t(),           # non-contiguous view, stride (1, 4)
        "column": base[:, 1],             # offset 1, stride 4
        "tail": shared[6:],               # offset 6 into a shared storage
        "head": shared[:3],
        "expanded": torch.tensor([7], dtype=torch.int8).expand(5),  # stride 0
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "f32": torch.tensor([0.5, -2.0], dtype=torch.float32),
        "f64": torch.tensor([[1e-3]], dtype=torch.float64),
        "f16": torch.tensor([1.0, -0.25, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([3.0, -0.5], dtype=torch.bfloat16),
        "scalar": torch.tensor(42, dtype=torch.int64),
        "empty": torch.zeros((0, 3), dtype=torch.int32),
        "nested": {"list": [torch.tensor([5, 6], dtype=torch.int32), [1, [2, [3]]]]},
    },
    "mixed.pt",
)
# A placement file in SGLang's --init-expert-location form: 4 layers (0 dense)
# of 6 physical slots over 4 logical experts.
torch.save(
    {"physical_to_logical_map": torch.tensor([[i % 4 for i in range(6)]] + [[2, 0, 3, 1, 2, 0]] * 3, dtype=torch.int64)},
    "init_expert_location.pt",
)
