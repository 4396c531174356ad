// Package torchpt reads and writes the tensor-only subset of PyTorch's
// torch.save files, the subset torch.load(weights_only=True) accepts:
// dicts, lists, tuples, integers, floats, strings, booleans, None and dense
// tensors.
//
// # File layout
//
// A torch.save file (PyTorch ≥ 1.6) is a zip archive whose entries share one
// top-level directory NAME:
//
//	NAME/data.pkl      the object tree, a pickle (protocol 2)
//	NAME/data/KEY      the raw bytes of storage KEY, little-endian unless NAME/byteorder says "big"
//	NAME/version       the archive format version ("3")
//	NAME/byteorder     optional (PyTorch 2.x): "little" or "big"
//
// A tensor appears in the pickle as a call of
// torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
// requires_grad, backward_hooks[, metadata]), where storage is a persistent
// id ('storage', torch.<Type>Storage, KEY, location, numel). The location
// ("cpu", "cuda:0") is ignored: every tensor is read into host memory.
//
// # Safety
//
// Reading never executes anything the file names. Before the pickle is
// decoded (with github.com/nlpodyssey/gopickle), a scan checks every opcode
// and its arguments against the bytes present, simulates the stack depth,
// and refuses any global other than the tensor-rebuilding functions, the
// storage types and collections.OrderedDict, with the error
// "pickle calls MODULE.NAME: not a tensor-only file". Opcodes that build
// arbitrary objects (INST, OBJ, NEWOBJ, BUILD, STACK_GLOBAL, extension codes,
// out-of-band buffers), byte strings and sets are refused as well. Every
// storage is checked against its zip entry's size and against
// Options.MaxTensorBytes before anything is allocated, and tensor data is
// read only when asked for (Tensor.Bytes, Tensor.Int64s, Tensor.Float64s),
// so a hostile header cannot cause a large allocation.
//
// # Values
//
// Open returns the decoded tree as Go values: nil, bool, int64, float64,
// string, []any (a Python list), Tuple, *Dict (dict and OrderedDict, in
// insertion order) and *Tensor. Write accepts the same kinds plus int,
// int32, []int, []int64 and map[string]any (written with sorted keys).
package torchpt
