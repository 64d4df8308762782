// fp8_host runs fp8.cu's scalar functions on the host for
// TestFP8HostEncode and its neighbours (fp8_host_test.go): the cast, the
// tensorwise scale and the delayed recipe's update, compared with package
// internal/fp8. The kernels' source runs unchanged (its __global__
// kernels are compiled by nvcc only). Built by the test with g++ without
// fused multiply-adds.
//
//	fp8_host encode fmt bf16 n
//	    stdin: n float32 → stdout: n codes (uint8) of fp8_encode(x) (of x rounded to bfloat16 first, if bf16)
//	fp8_host scale fmax n
//	    stdin: n amaxes (float32) → stdout: n scales (float32)
//	fp8_host delayed len scaledMax mostRecent
//	    stdin: len history values, the scale (float32) → stdout: the history, the scale
// Little-endian binary; fmax and scaledMax are decimal float32s printed exactly (%.9g).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define __host__
#define __device__
#define __forceinline__ inline

#include "../fp8.cu"

template <typename T>
static std::vector<T> read_n(size_t n) {
    std::vector<T> v(n);
    if (n && fread(v.data(), sizeof(T), n, stdin) != n) {
        fprintf(stderr, "fp8_host: short input\n");
        exit(1);
    }
    return v;
}

template <typename T>
static void write_all(const std::vector<T>& v) {
    if (!v.empty() && fwrite(v.data(), sizeof(T), v.size(), stdout) != v.size()) {
        fprintf(stderr, "fp8_host: short write\n");
        exit(1);
    }
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fp8_host encode|scale|delayed ...\n");
        return 2;
    }
    if (!strcmp(argv[1], "encode") && argc == 5) {
        const int fmt = atoi(argv[2]), bf16 = atoi(argv[3]);
        const size_t n = strtoull(argv[4], 0, 10);
        std::vector<float> x = read_n<float>(n);
        std::vector<uint8_t> out(n);
        for (size_t i = 0; i < n; i++) out[i] = fp8_encode(bf16 ? fp8_round_bf16(x[i]) : x[i], fmt);
        write_all(out);
        return 0;
    }
    if (!strcmp(argv[1], "scale") && argc == 4) {
        const float fmax = strtof(argv[2], 0);
        const size_t n = strtoull(argv[3], 0, 10);
        std::vector<float> a = read_n<float>(n);
        for (size_t i = 0; i < n; i++) a[i] = fp8_tensorwise_scale(a[i], fmax);
        write_all(a);
        return 0;
    }
    if (!strcmp(argv[1], "delayed") && argc == 5) {
        const int len = atoi(argv[2]), mostRecent = atoi(argv[4]);
        const float scaledMax = strtof(argv[3], 0);
        if (len < 1) {
            fprintf(stderr, "fp8_host: history length %d\n", len);
            return 2;
        }
        std::vector<float> h = read_n<float>((size_t)len + 1);
        fp8_delayed_update(h.data(), &h[len], len, scaledMax, mostRecent);
        write_all(h);
        return 0;
    }
    fprintf(stderr, "fp8_host: bad arguments\n");
    return 2;
}
