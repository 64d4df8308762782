// Package torchpt reads (and writes) files of PyTorch's torch.save without
// Python: the zip archive of PyTorch 1.6 and later (<name>/data.pkl, a
// pickle of the object, and <name>/data/<key>, one raw little-endian record
// per storage) and the older stream format (a magic number, protocol and
// sys_info pickles, the object pickle, the storage keys, then the storages).
// The tar format of PyTorch before 0.4 is refused.
//
// Open unpickles the object with a small pickle virtual machine (Unpickle)
// that executes nothing: classes and functions are names (*Global), and
// calls build placeholders (*Object with the class, arguments and BUILD
// state), except for the few callables a checkpoint needs:
//
//   - torch._utils._rebuild_tensor_v2 (and _rebuild_tensor,
//     _rebuild_parameter, torch._tensor._rebuild_from_type_v2): a *Tensor, a
//     strided view (offset, shape, stride) of a *Storage, checked against
//     the storage's size;
//   - collections.OrderedDict, dict, defaultdict: a *Dict (insertion order,
//     Python's key equality; BUILD's state, a state dict's _metadata, is
//     kept in Attrs);
//   - _codecs.encode (how protocol 2 pickles bytes), bytes, bytearray, set,
//     frozenset, list, torch.Size, copyreg's _reconstructor and __newobj__.
//
// Everything else — argparse.Namespace (read its fields with Object.Attr),
// Megatron's enums, numpy arrays and RNG states, io.BytesIO, torch.dtype
// values — stays a placeholder, so unknown classes never fail a load.
// Tensor data is read on demand (Tensor.Float32s converts F32, F64, F16 and
// BF16; other element types are refused by name) from the still-open file,
// so a checkpoint's structure can be inspected before its weights are read.
//
// Every length in the stream and every tensor view is checked before
// anything is allocated: corrupt or truncated files give errors naming the
// file (and, for the pickle, the byte offset and opcode), never a panic.
// FuzzUnpickle checks this.
//
// Save and Write are the inverse (write.go): they write the zip archive
// torch.save writes (pickle protocol 2, storages by persistent id, records
// aligned to 64 bytes) for the same values, tensors made with NewTensor or
// read from another file; torch.load reads it (TestWriteLoadsInPyTorch).
package torchpt
