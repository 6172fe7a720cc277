// The gpu-emu runtime: runs one launch of a registered kernel on the CPU, one OS thread per
// CUDA thread. Blocks run in waves of up to EMU_MAX_THREADS threads (at least two blocks a
// wave when the grid has two), every thread of a wave started before any is joined, so blocks
// overlap as on a GPU and the thread sanitizer sees their races. Called from Rust
// (crates/cuda/src/emu.rs) through `powerinfer_emu_launch`, with the argument array
// cuLaunchKernel would receive.
//
// Barriers are a mutex and condition variable (so the sanitizers see their ordering), with a
// timeout: a barrier that part of a block never reaches aborts the launch with an error instead
// of hanging. Threads that return drop out of their block's barrier and their warp's exchange.

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

extern "C" void powerinfer_emu_link_modules(void);  // emu_modules.cpp (written by build.rs)

namespace emu {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr std::size_t kMaxSharedBytes = 48 * 1024;  // static + dynamic, without opt-in
constexpr unsigned kMaxThreads = 2048;              // live OS threads per wave
constexpr std::size_t kStackBytes = 1 << 20;
constexpr int kYields = 2000;  // polls of a barrier's generation before sleeping,
constexpr std::chrono::milliseconds kYieldTime{5};  // for at most this long

/// Thrown inside a CUDA thread when its launch has failed, to unwind it out of the kernel.
struct Abort {};

struct Entry {
    Invoker invoke;
    std::vector<std::size_t> sizes;
};

std::map<std::string, Entry>& registry() {
    static std::map<std::string, Entry> r;
    return r;
}

std::chrono::milliseconds barrier_timeout() {
    const char* s = std::getenv("POWERINFER_EMU_TIMEOUT_S");
    const long v = s ? std::atol(s) : 0;
    return std::chrono::milliseconds(1000 * (v > 0 ? v : 60));
}

/// One launch: its first error, shared by every thread.
struct Launch {
    std::mutex m;
    std::string error;
    bool failed = false;
    std::chrono::milliseconds timeout = barrier_timeout();

    void fail(const std::string& why) {
        std::lock_guard<std::mutex> g(m);
        if (!failed) {
            failed = true;
            error = why;
        }
    }
    bool has_failed() {
        std::lock_guard<std::mutex> g(m);
        return failed;
    }
};

/// A barrier for `expected` threads that may drop out; breaks (every waiter throws) on timeout.
/// Waiters first yield the CPU while polling the generation (the threads they wait for are
/// runnable, and a yield costs less than a sleep and a wake-up), then sleep on the condition
/// variable. Arrivals go through the mutex and the generation is released by the last one, so
/// a barrier orders every thread's writes before it against every read after it.
struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned expected = 0, arrived = 0;
    std::atomic<unsigned long> generation{0};
    std::atomic<bool> broken{false};

    void release_locked() {
        arrived = 0;
        generation.fetch_add(1, std::memory_order_release);
        cv.notify_all();
    }

    void wait(Launch& launch, const char* what) {
        unsigned long gen;
        {
            std::lock_guard<std::mutex> g(m);
            if (broken) throw Abort{};
            if (++arrived == expected) {
                release_locked();
                return;
            }
            gen = generation.load(std::memory_order_relaxed);
        }
        // The timeout counts from arrival, yields included (on a busy machine a yield can take
        // a whole time slice of another process).
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kYields; ++i) {
            if (generation.load(std::memory_order_acquire) != gen) return;
            if (broken.load(std::memory_order_acquire)) throw Abort{};
            if (i % 64 == 63 && std::chrono::steady_clock::now() - start > kYieldTime) break;
            sched_yield();
        }
        std::unique_lock<std::mutex> g(m);
        const bool done = cv.wait_until(g, start + launch.timeout, [&] {
            return generation.load(std::memory_order_acquire) != gen || broken;
        });
        if (broken) throw Abort{};
        if (!done) {
            broken = true;
            cv.notify_all();
            // The message is made under the lock: dropping threads change `expected`.
            const std::string why = std::string(what) + ": " +
                                    std::to_string(expected - arrived) +
                                    " thread(s) never arrived (timeout; a barrier part of the "
                                    "block skips?)";
            g.unlock();
            launch.fail(why);
            throw Abort{};
        }
    }

    /// A thread returned: the barrier no longer waits for it.
    void drop() {
        std::lock_guard<std::mutex> g(m);
        --expected;
        if (arrived > 0 && arrived == expected) release_locked();
    }

    void break_all() {
        std::lock_guard<std::mutex> g(m);
        broken = true;
        cv.notify_all();
    }
};

/// A warp's exchange. Shuffle k writes and reads buffer k % 2 around one barrier: a lane can
/// write that buffer again (shuffle k + 2) only after every lane has arrived at shuffle k + 1,
/// that is after every read of shuffle k.
struct Warp {
    Barrier bar;
    float vals[2][kWarp] = {};
    std::atomic<unsigned> shuffles[kWarp] = {};  // per lane: shuffles it has entered
};

/// One block: its barrier, warps and shared memory.
struct Block {
    Launch* launch;
    Barrier bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::mutex shared_m;
    std::map<int, void*> statics;
    std::size_t static_bytes = 0, dynamic_bytes = 0;
    void* dynamic = nullptr;

    Block(Launch* l, unsigned threads, std::size_t smem) : launch(l), dynamic_bytes(smem) {
        bar.expected = threads;
        for (unsigned w = 0; w * kWarp < threads; ++w) {
            auto warp = std::make_unique<Warp>();
            const unsigned lanes = std::min(kWarp, threads - w * kWarp);
            warp->bar.expected = lanes;
            warps.push_back(std::move(warp));
        }
        // Exact size (the sanitizer's redzone right after it), garbage-filled.
        dynamic = std::malloc(smem);
        if (smem) std::memset(dynamic, 0xff, smem);
    }
    ~Block() {
        std::free(dynamic);
        for (auto& kv : statics) std::free(kv.second);
    }
};

/// What each CUDA thread's OS thread knows of its place.
struct Thread {
    Block* block;
    uint3 tid, bid, bdim, gdim;
    Invoker invoke;
    void** args;
};

thread_local Block* t_block = nullptr;

unsigned flat_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

void run_thread(Thread* t) {
    threadIdx = t->tid;
    blockIdx = t->bid;
    blockDim = t->bdim;
    gridDim = t->gdim;
    t_block = t->block;
    Block& b = *t->block;
    try {
        if (!b.launch->has_failed()) t->invoke(t->args);
    } catch (const Abort&) {
    } catch (const std::exception& e) {
        b.launch->fail(std::string("exception in a kernel thread: ") + e.what());
    } catch (...) {
        b.launch->fail("unknown exception in a kernel thread");
    }
    const unsigned f = flat_tid();
    b.warps[f / kWarp]->bar.drop();
    b.bar.drop();
}

/// Threads that have run CUDA threads wait here for the next one, so a launch costs a wake-up
/// per CUDA thread rather than a thread start. Each wave still gets a distinct OS thread per CUDA
/// thread, all running at once; the handoffs are mutex/condition-variable pairs, which the
/// thread sanitizer sees.
struct Wave {
    std::mutex m;
    std::condition_variable cv;
    std::size_t remaining = 0;
};

struct Worker {
    std::mutex m;
    std::condition_variable cv;
    Thread* task = nullptr;
    Wave* wave = nullptr;
};

void* worker_main(void* p) {
    Worker* w = static_cast<Worker*>(p);
    for (;;) {
        Thread* t;
        Wave* wave;
        {
            std::unique_lock<std::mutex> g(w->m);
            w->cv.wait(g, [&] { return w->task != nullptr; });
            t = w->task;
            wave = w->wave;
            w->task = nullptr;
        }
        run_thread(t);
        std::lock_guard<std::mutex> g(wave->m);
        if (--wave->remaining == 0) wave->cv.notify_all();
    }
    return nullptr;
}

struct Pool {
    std::mutex m;
    std::vector<Worker*> idle;

    /// `n` workers: idle ones first, then new threads; fewer when the OS refuses threads.
    std::vector<Worker*> take(std::size_t n) {
        std::vector<Worker*> out;
        {
            std::lock_guard<std::mutex> g(m);
            while (out.size() < n && !idle.empty()) {
                out.push_back(idle.back());
                idle.pop_back();
            }
        }
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, kStackBytes);
        while (out.size() < n) {
            Worker* w = new Worker();
            pthread_t h;
            if (pthread_create(&h, &attr, worker_main, w) != 0) {
                delete w;
                break;
            }
            pthread_detach(h);
            out.push_back(w);
        }
        pthread_attr_destroy(&attr);
        return out;
    }

    void give_back(const std::vector<Worker*>& ws) {
        std::lock_guard<std::mutex> g(m);
        idle.insert(idle.end(), ws.begin(), ws.end());
    }
};

/// The pool (never destroyed: its threads outlive static destructors). A child made by fork()
/// has none of its threads, so it starts a new pool (the old one, with a lock perhaps held by a
/// thread that did not survive the fork, is left alone).
Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
    std::call_once(g_pool_once, [] {
        g_pool = new Pool();
        pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool(); });
    });
    return *g_pool;
}

/// One launch at a time per process: a launch already uses every core, and concurrent launches
/// (parallel tests) would multiply the threads held by the pool.
std::mutex g_launch_m;

/// Run every thread of `ts` at once on workers of the pool, and wait for all.
bool run_wave(std::vector<Thread>& ts) {
    std::vector<Worker*> ws = pool().take(ts.size());
    if (ws.size() < ts.size()) {
        pool().give_back(ws);
        return false;
    }
    Wave wave;
    wave.remaining = ts.size();
    for (std::size_t i = 0; i < ts.size(); ++i) {
        std::lock_guard<std::mutex> g(ws[i]->m);
        ws[i]->task = &ts[i];
        ws[i]->wave = &wave;
        ws[i]->cv.notify_one();
    }
    {
        std::unique_lock<std::mutex> g(wave.m);
        wave.cv.wait(g, [&] { return wave.remaining == 0; });
    }
    pool().give_back(ws);
    return true;
}

}  // namespace

void sync_block() {
    Block& b = *t_block;
    b.bar.wait(*b.launch, "__syncthreads");
}

float shfl_xor(unsigned mask, float v, int lane_mask) {
    Block& b = *t_block;
    const unsigned f = flat_tid(), lane = f % kWarp, src = lane ^ (unsigned)lane_mask;
    if (mask != 0xffffffffu || src >= kWarp) {
        b.launch->fail("__shfl_xor_sync: only the full mask and lane masks below 32 are emulated");
        throw Abort{};
    }
    Warp& w = *b.warps[f / kWarp];
    const unsigned k = w.shuffles[lane]++;
    float* buf = w.vals[k % 2];
    buf[lane] = v;
    w.bar.wait(*b.launch, "__shfl_xor_sync");
    // The barrier drops returned lanes: one that never entered shuffle k left no value.
    if (w.shuffles[src] <= k) {
        b.launch->fail("__shfl_xor_sync: lane " + std::to_string(src) + " of warp " +
                       std::to_string(f / kWarp) + " returned before the shuffle");
        w.bar.break_all();
        throw Abort{};
    }
    return buf[src];
}

void* static_shared(int key, std::size_t bytes) {
    Block& b = *t_block;
    std::lock_guard<std::mutex> g(b.shared_m);
    auto it = b.statics.find(key);
    if (it != b.statics.end()) return it->second;
    b.static_bytes += bytes;
    if (b.static_bytes + b.dynamic_bytes > kMaxSharedBytes) {
        b.launch->fail("shared memory: " + std::to_string(b.static_bytes) + " static + " +
                       std::to_string(b.dynamic_bytes) + " dynamic bytes exceed 48 KiB");
        b.bar.break_all();
        throw Abort{};
    }
    void* p = std::malloc(bytes);
    std::memset(p, 0xff, bytes);
    b.statics.emplace(key, p);
    return p;
}

void* dynamic_shared() { return t_block->dynamic; }

bool register_entry(const char* name, Invoker invoke, const std::size_t* sizes, std::size_t n) {
    registry()[name] = Entry{invoke, std::vector<std::size_t>(sizes, sizes + n)};
    return true;
}

}  // namespace emu

namespace {

void set_error(char* err, std::size_t len, const std::string& msg) {
    if (len == 0) return;
    std::snprintf(err, len, "%s", msg.c_str());
}

}  // namespace

/// The body of powerinfer_emu_launch (below).
static int launch(const char* entry, const unsigned* grid, const unsigned* block, std::size_t smem,
                  void** args, const std::size_t* sizes, std::size_t nargs, char* err,
                  std::size_t errlen) {
    using namespace emu;
    powerinfer_emu_link_modules();
    auto it = registry().find(entry);
    if (it == registry().end()) {
        set_error(err, errlen, std::string("no kernel ") + entry + " in the emulator");
        return 1;
    }
    const Entry& e = it->second;
    if (e.sizes.size() != nargs) {
        set_error(err, errlen,
                  std::string(entry) + ": " + std::to_string(nargs) + " arguments, the kernel takes " +
                      std::to_string(e.sizes.size()));
        return 1;
    }
    for (std::size_t i = 0; i < nargs; ++i) {
        if (e.sizes[i] != sizes[i]) {
            set_error(err, errlen,
                      std::string(entry) + ": argument " + std::to_string(i) + " is " +
                          std::to_string(sizes[i]) + " bytes, the kernel's parameter " +
                          std::to_string(e.sizes[i]));
            return 1;
        }
    }
    const uint3 g{grid[0], grid[1], grid[2]}, b{block[0], block[1], block[2]};
    const unsigned long threads = (unsigned long)b.x * b.y * b.z;
    const unsigned long blocks = (unsigned long)g.x * g.y * g.z;
    if (threads == 0 || threads > kMaxBlockThreads || b.z > 64 || blocks == 0 || g.y > 65535 ||
        g.z > 65535 || g.x > 2147483647u) {
        set_error(err, errlen,
                  std::string(entry) + ": invalid launch (grid " + std::to_string(g.x) + "x" +
                      std::to_string(g.y) + "x" + std::to_string(g.z) + ", block " +
                      std::to_string(b.x) + "x" + std::to_string(b.y) + "x" + std::to_string(b.z) +
                      ")");
        return 1;
    }
    if (smem > kMaxSharedBytes) {
        set_error(err, errlen,
                  std::string(entry) + ": " + std::to_string(smem) +
                      " bytes of dynamic shared memory exceed 48 KiB");
        return 1;
    }
    emu::Launch launch;
    const unsigned long per_wave = std::max(2ul, kMaxThreads / threads);
    for (unsigned long first = 0; first < blocks && !launch.has_failed(); first += per_wave) {
        const unsigned long n = std::min(per_wave, blocks - first);
        std::vector<std::unique_ptr<Block>> wave;
        std::vector<Thread> ts(n * threads);
        for (unsigned long i = 0; i < n; ++i) {
            const unsigned long id = first + i;
            wave.push_back(std::make_unique<Block>(&launch, (unsigned)threads, smem));
            const uint3 bid{(unsigned)(id % g.x), (unsigned)(id / g.x % g.y),
                            (unsigned)(id / ((unsigned long)g.x * g.y))};
            for (unsigned long t = 0; t < threads; ++t) {
                Thread& th = ts[i * threads + t];
                th = Thread{wave.back().get(),
                            uint3{(unsigned)(t % b.x), (unsigned)(t / b.x % b.y),
                                  (unsigned)(t / ((unsigned long)b.x * b.y))},
                            bid,
                            b,
                            g,
                            e.invoke,
                            args};
            }
        }
        if (!run_wave(ts)) {
            set_error(err, errlen,
                      std::string(entry) + ": could not start " + std::to_string(ts.size()) +
                          " OS threads for a wave of CUDA threads");
            return 1;
        }
    }
    if (launch.failed) {
        set_error(err, errlen, std::string(entry) + ": " + launch.error);
        return 1;
    }
    return 0;
}

/// Run `entry` over grid × block with `smem` bytes of dynamic shared memory; `args[i]` points
/// to parameter i, whose size the caller gives in `sizes[i]`. 0 on success, else 1 with the
/// reason in `err`. No C++ exception leaves this function.
extern "C" int powerinfer_emu_launch(const char* entry, const unsigned* grid, const unsigned* block,
                                     std::size_t smem, void** args, const std::size_t* sizes,
                                     std::size_t nargs, char* err, std::size_t errlen) {
    try {
        std::lock_guard<std::mutex> g(emu::g_launch_m);
        return launch(entry, grid, block, smem, args, sizes, nargs, err, errlen);
    } catch (const std::exception& e) {
        set_error(err, errlen, std::string(entry) + ": the emulator failed: " + e.what());
    } catch (...) {
        set_error(err, errlen, std::string(entry) + ": the emulator failed");
    }
    return 1;
}

bool emu::launch_failed() { return t_block && t_block->launch->has_failed(); }

/// The registered kernels' names, separated by '\n', into `out` (at most `len` bytes with the
/// terminating 0); returns the bytes the whole list needs.
extern "C" std::size_t powerinfer_emu_entries(char* out, std::size_t len) {
    powerinfer_emu_link_modules();
    std::string all;
    for (const auto& kv : emu::registry()) {
        all += kv.first;
        all += '\n';
    }
    if (len) std::snprintf(out, len, "%s", all.c_str());
    return all.size() + 1;
}
