// host_harness.h: what the g++ host harnesses of the kernels
// (attntc_host.cc, fused_host.cc, moe_host.cc) share: a reusable barrier
// for the host threads that stand for a block's CUDA threads, and reading
// and writing their little-endian binary inputs and outputs. Define
// HOST_HARNESS_NAME (the program's name, for its error messages) before
// including it.

#ifndef HOST_HARNESS_H
#define HOST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include <condition_variable>
#include <mutex>
#include <vector>

// barrier: n threads meet; reusable (generation count).
struct barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n, count = 0;
    unsigned gen = 0;
    explicit barrier(int n) : n(n) {}
    void wait() {
        std::unique_lock<std::mutex> lk(mu);
        unsigned g = gen;
        if (++count == n) {
            count = 0;
            gen++;
            cv.notify_all();
            return;
        }
        cv.wait(lk, [&] { return gen != g; });
    }
};

// readN reads n values from stdin; a short input ends the program.
template <typename T>
static std::vector<T> readN(size_t n) {
    std::vector<T> v(n);
    if (n && fread(v.data(), sizeof(T), n, stdin) != n) {
        fprintf(stderr, HOST_HARNESS_NAME ": short input\n");
        exit(2);
    }
    return v;
}

// writeAll writes v to stdout.
template <typename T>
static void writeAll(const std::vector<T>& v) {
    fwrite(v.data(), sizeof(T), v.size(), stdout);
}

#endif
