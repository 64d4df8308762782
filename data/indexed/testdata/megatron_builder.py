# Writes golden .bin/.idx files with Megatron-LM's own IndexedDatasetBuilder
# (megatron/core/datasets/indexed_dataset.py at d98e8a6). CI never runs it.
#
# Usage: /usr/bin/python3 megatron_builder.py MEGATRON_STUB_DIR
# where MEGATRON_STUB_DIR holds megatron/core/datasets/{indexed_dataset,
# object_storage_utils}.py and megatron/core/msc_utils.py copied from a
# Megatron checkout, empty __init__.py files, and megatron/core/utils.py
# defining log_single_rank(logger, *args, **kwargs) (that import is all the
# builder needs from the rest of Megatron). Needs numpy and torch.
import sys
sys.path.insert(0, sys.argv[1])
import numpy, torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, DType

def build(name, dtype, multimodal, fn):
    b = IndexedDatasetBuilder(name + ".bin", dtype=dtype, multimodal=multimodal)
    fn(b)
    b.finalize(name + ".idx")

def sentences(b):
    # multi-sequence documents and an empty document
    b.add_document(torch.tensor([1, 2, 3, 4, 5]), [2, 3])
    b.add_document(torch.tensor([], dtype=torch.int64), [])
    b.add_document(torch.tensor([70000, 6]), [1, 1])
    b.add_item(torch.tensor([7, 8, 9]))
    b.end_document()

def multimodal(b):
    b.add_document(torch.tensor([1, 2, 3]), [1, 2], modes=[0, 1])
    b.add_item(torch.tensor([4]), mode=2)
    b.end_document()
    b.add_document(torch.tensor([5, 6]), [2])  # modes default to 0

build("mg_sentences_int32", numpy.int32, False, sentences)
build("mg_multimodal_uint16", numpy.uint16, True, multimodal)
build("mg_int64", numpy.int64, False, lambda b: b.add_document(torch.tensor([-3, 2**40 % 2**31, 9]), [3]))
build("mg_float32", numpy.float32, False, lambda b: b.add_document(torch.tensor([1, 2, 3]), [3]))
build("mg_uint8", numpy.uint8, False, lambda b: b.add_document(torch.tensor([255, 0]), [2]))

def merged(b):
    b.add_document(torch.tensor([10, 11]), [2])
    b.add_index("mg_sentences_int32")
    b.add_document(torch.tensor([12]), [1])
    b.add_index("mg_sentences_int32")
build("mg_add_index_int32", numpy.int32, False, merged)
