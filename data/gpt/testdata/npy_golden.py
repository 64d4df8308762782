# Writes numpy.save goldens for npy_test.go (run with /usr/bin/python3; numpy 1.24).
import numpy
numpy.save("golden_i4.npy", numpy.array([0, -1, 7], dtype=numpy.int32), allow_pickle=True)
numpy.save("golden_i4_2d.npy", numpy.array([[0, 0], [2, 2], [4, 0], [6, 1]], dtype=numpy.int32), allow_pickle=True)
numpy.save("golden_u4.npy", numpy.array([2, 3, 8, 4294967295], dtype=numpy.uint32), allow_pickle=True)
numpy.save("golden_i2.npy", numpy.array([0, 1, -2], dtype=numpy.int16), allow_pickle=True)
numpy.save("golden_i8.npy", numpy.arange(12345678901, 12345678901 + 3, dtype=numpy.int64), allow_pickle=True)
