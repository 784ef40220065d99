// cuda_sim.h: CUDA's thread model executed on the CPU, for checking hand-written kernels without a GPU
// (exercise 17, flashcourse.grading.ex17).
//
// Every thread of a block is a coroutine (ucontext). The scheduler runs the threads of a block one after another,
// each until it reaches __syncthreads(), a warp shuffle or its end; then it releases the barrier or exchanges the
// shuffled values, and goes on. Nothing runs in parallel, so a run is deterministic; the schedule order (threads
// 0, 1, 2, ... or the reverse) is chosen by sim::order. A kernel that is missing a barrier reads shared memory
// before another thread wrote it in one of the two orders, so its result depends on the order: the checker runs
// both and calls that a race. Shuffles check their mask against the lanes that call them, a barrier checks that
// every thread of the block reaches it, and global buffers carry guard zones that catch reads and writes out of
// bounds. __shared__ arrays are static: they keep the previous block's values (never zeros a kernel could rely on).
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <math.h>  // expf, fmaxf, sqrtf, logf in the global namespace, as in CUDA
#include <type_traits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

namespace sim {

[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "SIM-ERROR: %s\n", what.c_str());
    std::exit(3);
}

enum class State { ready, barrier, shuffle, done };
enum class Shuffle { sync, xor_, down, up };

struct Thread {
    ucontext_t context;
    std::vector<char> stack;
    State state = State::ready;
    dim3 idx;
    int linear = 0;
    int barrier_line = 0;
    // a pending shuffle: its kind, mask, argument (lane, lane mask or delta), width and the value, as 8 bytes
    Shuffle kind = Shuffle::sync;
    unsigned mask = 0;
    int argument = 0, width = 32, line = 0;
    uint64_t value = 0, result = 0;
};

inline std::vector<Thread> threads;
inline ucontext_t scheduler;
inline int current = -1;
inline dim3 block_index, block_dim, grid_dim;
inline bool reverse_order = false;  // the schedule: threads in increasing or decreasing order
inline std::function<void()> body;

inline void trampoline() {
    body();
    threads[current].state = State::done;
    swapcontext(&threads[current].context, &scheduler);
}

inline void yield() { swapcontext(&threads[current].context, &scheduler); }

inline void syncthreads(int line) {
    threads[current].state = State::barrier;
    threads[current].barrier_line = line;
    yield();
}

template <typename T>
T shuffle(Shuffle kind, unsigned mask, T value, int argument, int width, int line) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    Thread& me = threads[current];
    me.state = State::shuffle;
    me.kind = kind;
    me.mask = mask;
    me.argument = argument;
    me.width = width;
    me.line = line;
    me.value = 0;
    std::memcpy(&me.value, &value, sizeof(T));
    yield();
    T out;
    std::memcpy(&out, &threads[current].result, sizeof(T));
    return out;
}

inline std::string hex(unsigned v) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", v);
    return text;
}

// All lanes of one warp that have not exited are waiting at a shuffle: check the mask, exchange the values.
inline void resolve_warp(int first, int count) {
    unsigned calling = 0;
    for (int lane = 0; lane < count; ++lane)
        if (threads[first + lane].state == State::shuffle) calling |= 1u << lane;
    for (int lane = 0; lane < count; ++lane) {
        Thread& t = threads[first + lane];
        if (t.state != State::shuffle) continue;
        if (!(t.mask >> lane & 1u))
            fail("shuffle mask " + hex(t.mask) + " (line " + std::to_string(t.line) + ") leaves out lane " +
                 std::to_string(lane) + ", which calls it: the mask must name every lane that calls the shuffle "
                 "(0xffffffff for a full warp)");
        if ((t.mask & calling) != t.mask)
            fail("shuffle mask " + hex(t.mask) + " (line " + std::to_string(t.line) + ") names lanes that do not "
                 "call it (lanes calling: " + hex(calling) + "); a lane past the end of the data must still take "
                 "part in the shuffle");
    }
    for (int lane = 0; lane < count; ++lane) {
        Thread& t = threads[first + lane];
        if (t.state != State::shuffle) continue;
        int width = t.width, base = lane / width * width, source = lane;
        switch (t.kind) {
            case Shuffle::sync: source = base + t.argument % width; break;
            case Shuffle::xor_: source = lane ^ t.argument; if (source >= base + width) source = lane; break;
            case Shuffle::down: source = lane + t.argument; if (source >= base + width) source = lane; break;
            case Shuffle::up: source = lane - t.argument; if (source < base) source = lane; break;
        }
        if (source >= count || threads[first + source].state != State::shuffle)
            fail("a shuffle (line " + std::to_string(t.line) + ") on lane " + std::to_string(lane) +
                 " reads lane " + std::to_string(source) + ", which does not take part");
        t.result = threads[first + source].value;
    }
    for (int lane = 0; lane < count; ++lane)
        if (threads[first + lane].state == State::shuffle) threads[first + lane].state = State::ready;
}

inline void run_block(dim3 block, int stack_bytes) {
    int n = block.x * block.y * block.z;
    threads.assign(n, Thread());
    for (int i = 0; i < n; ++i) {
        Thread& t = threads[i];
        t.linear = i;
        t.idx = dim3(i % block.x, i / block.x % block.y, i / (block.x * block.y));
        t.stack.resize(stack_bytes);
        getcontext(&t.context);
        t.context.uc_stack.ss_sp = t.stack.data();
        t.context.uc_stack.ss_size = t.stack.size();
        t.context.uc_link = nullptr;
        makecontext(&t.context, trampoline, 0);
    }
    for (;;) {
        bool ran = false;
        for (int k = 0; k < n; ++k) {
            int i = reverse_order ? n - 1 - k : k;
            if (threads[i].state != State::ready) continue;
            current = i;
            ran = true;
            swapcontext(&scheduler, &threads[i].context);
        }
        current = -1;
        int done = 0, at_barrier = 0, at_shuffle = 0;
        for (auto& t : threads) {
            done += t.state == State::done;
            at_barrier += t.state == State::barrier;
            at_shuffle += t.state == State::shuffle;
        }
        if (done == n) return;
        if (at_shuffle) {  // warps whose every live lane waits at a shuffle exchange their values
            bool progressed = false;
            for (int first = 0; first < n; first += 32) {
                int count = std::min(32, n - first), waiting = 0, live = 0;
                for (int lane = 0; lane < count; ++lane) {
                    State s = threads[first + lane].state;
                    live += s != State::done;
                    waiting += s == State::shuffle;
                }
                if (waiting && waiting == live) {
                    resolve_warp(first, count);
                    progressed = true;
                }
            }
            if (progressed) continue;
            for (auto& t : threads)
                if (t.state == State::shuffle)
                    fail("a warp is stuck: the shuffle with mask " + hex(t.mask) + " (line " + std::to_string(t.line) +
                         ") waits for lanes that went on to __syncthreads() or returned: a shuffle inside a branch "
                         "that part of the warp does not take (`if (i < n)`): lanes past the end must still take "
                         "part in the shuffle");
        }
        if (at_barrier) {
            if (at_barrier + done != n || done)
                fail("__syncthreads() (line " + std::to_string(threads[0].barrier_line) + ") is not reached by every "
                     "thread of the block (" + std::to_string(done) + " of " + std::to_string(n) + " threads had "
                     "returned): a barrier inside a branch, or an early return before it");
            for (auto& t : threads) t.state = State::ready;
            continue;
        }
        if (!ran) fail("no thread can make progress");
    }
}

// A global buffer with guard zones on both sides, filled with NaN (floats) or a marker (ints): a read past the
// end returns them, a write past the end changes them, and the checker reports either.
template <typename T>
struct Buffer {
    static constexpr int guard = 4096;
    std::vector<T> storage;
    size_t n;
    explicit Buffer(size_t count) : storage(count + 2 * guard), n(count) {
        for (auto& v : storage) v = marker();
    }
    static T marker() {
        if constexpr (std::is_floating_point_v<T>) return std::nanf("0x5a5a"); else return T(-123456789);
    }
    T* data() { return storage.data() + guard; }
    bool guards_intact() const {
        for (int i = 0; i < guard; ++i) {
            if (!same(storage[i])) return false;
            if (!same(storage[guard + n + i])) return false;
        }
        return true;
    }
    static bool same(T v) {
        T m = marker();
        return std::memcmp(&v, &m, sizeof(T)) == 0;
    }
};

template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
    if (block.x * block.y * block.z > 1024) fail("a block of more than 1024 threads");
    grid_dim = grid;
    block_dim = block;
    body = [&] { kernel(args...); };
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                block_index = dim3(x, y, z);
                run_block(block, 64 * 1024);
            }
}

}  // namespace sim

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define threadIdx (sim::threads[sim::current].idx)
#define blockIdx (sim::block_index)
#define blockDim (sim::block_dim)
#define gridDim (sim::grid_dim)
#define warpSize 32
#define __syncthreads() sim::syncthreads(__LINE__)
#define __syncwarp(...) ((void)0)  // lanes of a warp run in lock-step at every shuffle here
#define __shfl_sync(mask, v, lane, ...) sim::shuffle(sim::Shuffle::sync, mask, v, lane, sim_width(__VA_ARGS__), __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) sim::shuffle(sim::Shuffle::xor_, mask, v, m, sim_width(__VA_ARGS__), __LINE__)
#define __shfl_down_sync(mask, v, d, ...) sim::shuffle(sim::Shuffle::down, mask, v, d, sim_width(__VA_ARGS__), __LINE__)
#define __shfl_up_sync(mask, v, d, ...) sim::shuffle(sim::Shuffle::up, mask, v, d, sim_width(__VA_ARGS__), __LINE__)
inline int sim_width(int width = 32) { return width; }

inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
template <typename T>
T atomicAdd(T* address, T value) {  // one thread runs at a time: a plain read-modify-write is atomic here
    T old = *address;
    *address = old + value;
    return old;
}
