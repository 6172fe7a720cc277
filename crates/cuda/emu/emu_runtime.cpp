// The gpu-emu runtime: runs one launch of a registered kernel on the CPU. Called from Rust
// (crates/cuda/src/emu.rs) through `powerinfer_emu_launch`, with the argument array
// cuLaunchKernel would receive.
//
// A launch runs on the calling OS thread (tests and engines that launch from several threads run
// their launches side by side), its CUDA threads as fibers (a stack each, switched by
// emu_fibers.h), block after block, each fiber in thread order until it waits at a barrier or
// returns. A barrier releases when every live thread of its block (or, for a shuffle, its warp)
// has arrived; the waiters become ready in the order they came and the last arrival runs on. So
// a kernel missing a __syncthreads reads what other threads have not yet written (0xff
// garbage), every time, and a barrier nobody can release (every live fiber waiting) is an error
// at once. Threads that return drop out of their block's barrier and their warp's exchange.
// Fibers are kept per OS thread and reused: each loops, running the CUDA thread it is given and
// switching back. Switching fibers costs a small fraction of waking an OS thread, which is where
// an emulated launch used to spend its time (one OS thread per CUDA thread).
//
// Under the sanitizers (POWERINFER_EMU_SANITIZE) the fibers are announced to them
// (emu_fibers.h). ThreadSanitizer sees each fiber as a thread and orders fibers only where CUDA
// orders threads: a block's start after its setup, a barrier's leavers (__syncthreads, a
// shuffle's lanes) after every arrival, the block's end before its teardown. Blocks run in waves of up to kMaxWave CUDA threads (at least two
// blocks), all set up before any runs and torn down after all have run, on fibers none of them
// shares: nothing orders one block of a wave after another, so races between blocks (an atomic
// written as a plain add) are reported too.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "emu_fibers.h"

extern "C" void powerinfer_emu_link_modules(void);  // emu_modules.cpp (written by build.rs)

namespace emu {
namespace {

using fiber::Untracked;

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr std::size_t kMaxSharedBytes = 48 * 1024;  // static + dynamic, without opt-in
constexpr unsigned long kMaxWave = 256;  // ThreadSanitizer: CUDA threads on distinct fibers

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

/// One launch: its first error, shared by every thread. `failed` is read without ordering
/// (a relaxed atomic), so that asking orders no fiber after another for ThreadSanitizer.
struct Launch {
    std::mutex m;
    std::string error;
    std::atomic<bool> failed{false};
    std::chrono::milliseconds timeout = barrier_timeout();

    void fail(const std::string& why) {
        std::lock_guard<std::mutex> g(m);
        if (!failed.load(std::memory_order_relaxed)) {
            error = why;
            failed.store(true, std::memory_order_relaxed);
        }
    }
    bool has_failed() const { return failed.load(std::memory_order_relaxed); }
};

struct Thread;

/// A fiber of this OS thread's pool: it runs the CUDA thread `th` it is given, sets `done` and
/// switches back to the scheduler, again and again.
struct Fiber {
    fiber::Context ctx;
    Thread* th = nullptr;
    bool done = false;
};

/// The fibers of the block an OS thread runs now: the ones ready to run, in order, and the one
/// running.
struct Scheduler {
    fiber::Context main;  // the OS thread's own stack, where the scheduling loop runs
    std::deque<Fiber*> ready;
    Fiber* current = nullptr;
};

thread_local Scheduler* t_sched = nullptr;

/// A barrier for `expected` fibers of one block that may drop out: a fiber that arrives before
/// the last switches to the next ready one; the last arrival makes the waiters ready (in the
/// order they came) and runs on. Broken (a failed launch), every waiter resumes and unwinds.
/// For ThreadSanitizer each arrival releases, and each leaver acquires, the sync word of its
/// generation (two alternate: generation g + 2 cannot begin before every fiber has left g).
struct Barrier {
    unsigned expected = 0, arrived = 0;
    unsigned long generation = 0;
    std::vector<Fiber*> waiters;
    const char* what = "";  // the construct the waiters wait in
    std::chrono::steady_clock::time_point since;  // when the first of them arrived
    bool broken = false;
    char sync[2] = {};

    void release() {
        for (Fiber* f : waiters) t_sched->ready.push_back(f);
        waiters.clear();
        arrived = 0;
        ++generation;
    }

    /// Wait for the other members; ThreadSanitizer sees the leavers ordered after every arrival.
    /// (A shuffle orders its lanes' memory too: what a lane read before a warp sum, another lane
    /// may write after it, as rope's per-head norm does in place; the lanes' data dependence
    /// through the shuffle orders them on a GPU.)
    void wait(const Launch& launch, const char* construct) {
        char* word;
        {
            Untracked u;
            if (broken || launch.has_failed()) throw Abort{};
            word = &sync[generation % 2];
        }
        fiber::release(word);
        Fiber* me = nullptr;
        {
            Untracked u;
            if (++arrived == expected) {
                release();
            } else {
                if (waiters.empty()) since = std::chrono::steady_clock::now();
                what = construct;
                me = t_sched->current;
                waiters.push_back(me);
            }
        }
        if (me) {
            fiber::swap(me->ctx, t_sched->main);
            Untracked u;
            if (broken || launch.has_failed()) throw Abort{};
        }
        fiber::acquire(word);
    }

    /// A fiber returned: the barrier no longer waits for it.
    void drop() {
        Untracked u;
        --expected;
        if (arrived > 0 && arrived == expected) release();
    }

    void break_all() {
        Untracked u;
        broken = true;
        release();
    }

    /// Why the waiters wait forever: `expected - arrived` members are elsewhere.
    std::string never(const char* why) const {
        Untracked u;
        return std::string(what) + ": " + std::to_string(expected - arrived) +
               " thread(s) never arrived (" + why + "; a barrier part of the block skips?)";
    }
};

/// A warp's exchange. Shuffle k writes and reads buffer k % 2 around one barrier: a lane can
/// write that buffer again (shuffle k + 2) only after every lane has arrived at shuffle k + 1,
/// that is after every read of shuffle k.
struct Warp {
    Barrier bar;
    float vals[2][kWarp] = {};
    unsigned shuffles[kWarp] = {};  // per lane: shuffles it has entered (bookkeeping)
};

/// One block: its barrier, warps and shared memory; `start` / `end` order its setup before its
/// threads and its threads before its teardown (ThreadSanitizer).
struct Block {
    Launch* launch;
    Barrier bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::map<int, void*> statics;
    std::size_t static_bytes = 0, dynamic_bytes = 0;
    void* dynamic = nullptr;
    char start = 0, end = 0;

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

/// What each CUDA thread knows of its place.
struct Thread {
    Block* block;
    uint3 tid, bid, bdim, gdim;
    Invoker invoke;
    void** args;
};

thread_local Block* t_block = nullptr;

unsigned flat_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

void run_thread(Thread* t) {
    Block* bp;
    {
        Untracked u;  // set before the block's start, which orders the rest
        bp = t->block;
    }
    Block& b = *bp;
    fiber::acquire(&b.start);
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
    fiber::release(&b.end);
}

/// A fiber's life: CUDA threads, one after another, each followed by a switch back.
void fiber_loop(void* p) {
    fiber::started();
    Fiber* f = static_cast<Fiber*>(p);
    for (;;) {
        Thread* th;
        {
            Untracked u;
            th = f->th;
        }
        run_thread(th);
        {
            Untracked u;
            f->done = true;
        }
        fiber::swap(f->ctx, t_sched->main);
    }
}

/// This OS thread's fibers: made on demand, kept for its later launches, freed with it (every
/// one suspended in its loop then).
struct FiberPool {
    std::vector<std::unique_ptr<Fiber>> all;
    std::vector<Fiber*> idle;

    Fiber* take() {
        if (!idle.empty()) {
            Fiber* f = idle.back();
            idle.pop_back();
            return f;
        }
        auto f = std::make_unique<Fiber>();
        fiber::make(f->ctx, fiber::make_stack(), &fiber_loop, f.get());
        all.push_back(std::move(f));
        return all.back().get();
    }
    ~FiberPool() {
        for (auto& f : all) fiber::free_stack(f->ctx.stack);
    }
};

thread_local FiberPool t_fibers;

/// Run every thread of block `b` (`ts[0..n]`, in thread order) on fibers of this OS thread's
/// pool until all have returned (the fibers then go to `used`, for the caller to give back).
/// Fibers that wait at barriers nobody can release fail the launch, then unwind. The caller
/// orders the block's end (`acquire(&b.end)`) before its teardown.
void run_block(Block& b, Thread* ts, std::size_t n, std::vector<Fiber*>& used) {
    Untracked u;  // the scheduler's side (its fibers track their own accesses)
    Scheduler s;
    fiber::make_main(s.main);
    const std::size_t first = used.size();
    for (std::size_t i = 0; i < n; ++i) {
        Fiber* f = t_fibers.take();
        f->th = &ts[i];
        f->done = false;
        used.push_back(f);
        s.ready.push_back(f);
    }
    const auto all_done = [&] {
        return std::all_of(used.begin() + first, used.end(), [](Fiber* f) { return f->done; });
    };
    t_sched = &s;
    t_block = &b;
    blockIdx = ts[0].bid;
    blockDim = ts[0].bdim;
    gridDim = ts[0].gdim;
    fiber::release(&b.start);
    for (int round = 0; round < 2; ++round) {
        while (!s.ready.empty()) {
            s.current = s.ready.front();
            s.ready.pop_front();
            threadIdx = s.current->th->tid;
            fiber::swap(s.main, s.current->ctx);
        }
        if (all_done()) break;
        // Every live fiber waits, so none of these barriers can release: name one, then
        // break them all (their waiters resume and unwind; the second round runs them).
        std::string why;
        if (!b.bar.waiters.empty()) why = b.bar.never("every other thread waits elsewhere");
        for (auto& w : b.warps) {
            if (why.empty() && !w->bar.waiters.empty()) {
                why = w->bar.never("every other lane waits elsewhere");
            }
        }
        b.launch->fail(why.empty() ? "fibers left waiting (emulator bug)" : why);
        b.bar.break_all();
        for (auto& w : b.warps) w->bar.break_all();
    }
    t_sched = nullptr;
    t_block = nullptr;
    // A fiber that did not unwind would still be inside its CUDA thread (not reached: an Abort
    // reaches every waiter, and run_thread catches everything).
    if (!all_done()) std::abort();
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
    unsigned k;
    {
        Untracked u;
        k = w.shuffles[lane]++;
    }
    float* buf = w.vals[k % 2];
    buf[lane] = v;
    w.bar.wait(*b.launch, "__shfl_xor_sync");
    // The barrier drops returned lanes: one that never entered shuffle k left no value.
    bool returned;
    {
        Untracked u;
        returned = w.shuffles[src] <= k;
    }
    if (returned) {
        b.launch->fail("__shfl_xor_sync: lane " + std::to_string(src) + " of warp " +
                       std::to_string(f / kWarp) + " returned before the shuffle");
        w.bar.break_all();
        throw Abort{};
    }
    return buf[src];
}

void* static_shared(int key, std::size_t bytes) {
    Block& b = *t_block;
    // The first thread to declare the array allocates it and fills it with garbage; to
    // ThreadSanitizer that is nobody's write (the threads' own accesses are what it checks).
    Untracked u;
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
    // The threads of block `id` of the grid, in thread order.
    const auto place = [&](Block* blk, unsigned long id, Thread* out) {
        const uint3 bid{(unsigned)(id % g.x), (unsigned)(id / g.x % g.y),
                        (unsigned)(id / ((unsigned long)g.x * g.y))};
        for (unsigned long t = 0; t < threads; ++t) {
            out[t] = Thread{blk,
                            uint3{(unsigned)(t % b.x), (unsigned)(t / b.x % b.y),
                                  (unsigned)(t / ((unsigned long)b.x * b.y))},
                            bid,
                            b,
                            g,
                            e.invoke,
                            args};
        }
    };
    // Block after block, each block's fibers back to the pool when it ends; under
    // ThreadSanitizer in waves (see the top of this file).
    const unsigned long per_wave = EMU_TSAN ? std::max(2ul, kMaxWave / threads) : 1;
    std::vector<Fiber*> used;
    for (unsigned long first = 0; first < blocks && !launch.has_failed(); first += per_wave) {
        const unsigned long n = std::min(per_wave, blocks - first);
        std::vector<std::unique_ptr<Block>> wave;
        std::vector<Thread> ts(n * threads);
        for (unsigned long i = 0; i < n; ++i) {
            wave.push_back(std::make_unique<Block>(&launch, (unsigned)threads, smem));
            place(wave.back().get(), first + i, &ts[i * threads]);
        }
        for (unsigned long i = 0; i < n; ++i) run_block(*wave[i], &ts[i * threads], threads, used);
        for (auto& blk : wave) fiber::acquire(&blk->end);
        for (Fiber* f : used) t_fibers.idle.push_back(f);
        used.clear();
    }
    if (launch.has_failed()) {
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
        return launch(entry, grid, block, smem, args, sizes, nargs, err, errlen);
    } catch (const std::exception& e) {
        set_error(err, errlen, std::string(entry) + ": the emulator failed: " + e.what());
    } catch (...) {
        set_error(err, errlen, std::string(entry) + ": the emulator failed");
    }
    return 1;
}

bool emu::launch_failed() {
    if (!t_block) return false;
    Block& b = *t_block;
    // A fiber that polls without reaching a barrier (the deadlock self-test) keeps the others
    // of its block from running: past the timeout, a barrier it leaves waiting fails the launch.
    bool stuck;
    {
        Untracked u;
        stuck = !b.bar.waiters.empty() &&
                std::chrono::steady_clock::now() - b.bar.since > b.launch->timeout;
    }
    if (stuck && !b.launch->has_failed()) {
        b.launch->fail(b.bar.never("timeout"));
        b.bar.break_all();
    }
    return b.launch->has_failed();
}

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
