// Fibers for the emulator (emu_runtime.cpp, its only includer): a stack per CUDA thread and a
// switch between stacks on one OS thread. On x86-64 the switch saves the callee-saved registers
// and the SSE/x87 control words and swaps stack pointers (a few nanoseconds); elsewhere (or with
// EMU_UCONTEXT defined) it is ucontext's swapcontext, which also saves the signal mask (a
// system call each way).
//
// Under the sanitizers each switch is announced: to AddressSanitizer (the stack being entered,
// so that it knows which stack is live and unwinding through a fiber works), and to
// ThreadSanitizer, for which each fiber is a thread of its own and a switch implies no ordering
// (`__tsan_switch_to_fiber_no_sync`): the runtime orders fibers only where CUDA does (barriers,
// the start and end of a block), so an access one thread makes and another thread makes
// unordered is reported as a race, as between OS threads. The runtime's own bookkeeping, which
// the fibers of one OS thread share without a lock, is hidden from it (`Untracked`).

#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
// ThreadSanitizer's dynamic annotations (its runtime defines them).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#else
#define EMU_TSAN 0
#endif

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>

#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace emu::fiber {

/// Bytes of each fiber's stack, a guard page below it (a kernel's frames take a few KiB; an
/// overflow faults instead of writing into the next stack).
constexpr std::size_t kStackBytes = 256 * 1024;

/// Hides the memory accesses of its scope from ThreadSanitizer (nothing otherwise): the
/// runtime's bookkeeping, shared by the fibers of one OS thread without a lock.
struct Untracked {
#if EMU_TSAN
    Untracked() {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~Untracked() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
#else
    Untracked() {}   // user-provided: a guard, not an unused variable
    ~Untracked() {}
#endif
    Untracked(const Untracked&) = delete;
    Untracked& operator=(const Untracked&) = delete;
};

/// Happens-before for ThreadSanitizer (nothing otherwise): what a fiber did before
/// `release(a)` is ordered before what any fiber does after a later `acquire(a)`.
inline void release([[maybe_unused]] void* a) {
#if EMU_TSAN
    __tsan_release(a);
#endif
}
inline void acquire([[maybe_unused]] void* a) {
#if EMU_TSAN
    __tsan_acquire(a);
#endif
}

/// A fiber's stack (its low end; a guard page below) and, under ThreadSanitizer, the fiber's
/// identity there: made once, reused.
struct Stack {
    void* low = nullptr;
    void* tsan = nullptr;
};

/// A new stack (and, under ThreadSanitizer, a new fiber identity there).
inline Stack make_stack() {
    const std::size_t page = (std::size_t)sysconf(_SC_PAGESIZE);
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    mprotect(p, page, PROT_NONE);
    Stack s;
    s.low = static_cast<char*>(p) + page;
#if EMU_TSAN
    s.tsan = __tsan_create_fiber(0);
#endif
    return s;
}

/// Unmap a stack no fiber runs on any more (it may be suspended there).
inline void free_stack(const Stack& s) {
    const std::size_t page = (std::size_t)sysconf(_SC_PAGESIZE);
#if EMU_TSAN
    __tsan_destroy_fiber(s.tsan);
#endif
#if EMU_ASAN
    // The stack's frames left poisoned redzones: memory mapped here later must not inherit them.
    __asan_unpoison_memory_region(s.low, kStackBytes);
#endif
    munmap(static_cast<char*>(s.low) - page, kStackBytes + page);
}

/// A suspended fiber, or the OS thread's own stack (`main`).
struct Context {
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    void* sp = nullptr;  // its saved stack pointer
#else
    ucontext_t uc;
    void (*entry)(void*) = nullptr;  // what it runs (it must not move once made)
    void* arg = nullptr;
#endif
    bool main = false;
    Stack stack;
};

/// AddressSanitizer's bounds of the OS thread's own stack, learned when a fiber is entered from
/// it (fibers are entered from it and return to it only).
inline thread_local const void* t_main_low = nullptr;
inline thread_local std::size_t t_main_size = 0;

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)

extern "C" void powerinfer_emu_fiber_switch(void** save, void* next);
extern "C" void powerinfer_emu_fiber_start();

// Switch: push the System V callee-saved registers and the MXCSR / x87 control words, save the
// stack pointer in *save, load `next`, pop the same from it and return into it. Start: a new
// fiber's first switch returns here, with the entry in r12 and its argument in rbx.
asm(R"(
    .text
    .globl powerinfer_emu_fiber_switch
    .type powerinfer_emu_fiber_switch, @function
powerinfer_emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size powerinfer_emu_fiber_switch, .-powerinfer_emu_fiber_switch

    .globl powerinfer_emu_fiber_start
    .type powerinfer_emu_fiber_start, @function
powerinfer_emu_fiber_start:
    movq %rbx, %rdi
    call *%r12
    ud2
    .size powerinfer_emu_fiber_start, .-powerinfer_emu_fiber_start
)");

inline void make_raw(Context& c, void (*entry)(void*), void* arg) {
    // The top, 16-byte aligned; the return address of the first switch 8 below it, so that
    // the start routine calls `entry` with the stack aligned as the ABI requires.
    const auto top =
        (reinterpret_cast<std::uintptr_t>(c.stack.low) + kStackBytes) & ~std::uintptr_t{15};
    auto* slot = reinterpret_cast<std::uint64_t*>(top);
    slot[-1] = reinterpret_cast<std::uint64_t>(&powerinfer_emu_fiber_start);  // ret
    slot[-2] = 0;                                                              // rbp
    slot[-3] = reinterpret_cast<std::uint64_t>(arg);                           // rbx
    slot[-4] = reinterpret_cast<std::uint64_t>(entry);                         // r12
    slot[-5] = slot[-6] = slot[-7] = 0;                                        // r13 r14 r15
    slot[-8] = 0x1F80ull | (0x037Full << 32);  // MXCSR and x87 control word at their defaults
    c.sp = &slot[-8];
}

inline void swap_raw(Context& from, Context& to) { powerinfer_emu_fiber_switch(&from.sp, to.sp); }

#else

/// makecontext passes int arguments: the Context's address in two halves.
inline void start_raw(unsigned hi, unsigned lo) {
    auto* c = reinterpret_cast<Context*>((static_cast<std::uintptr_t>(hi) << 32) | lo);
    c->entry(c->arg);
}

inline void make_raw(Context& c, void (*entry)(void*), void* arg) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = c.stack.low;
    c.uc.uc_stack.ss_size = kStackBytes;
    c.uc.uc_link = nullptr;
    c.entry = entry;
    c.arg = arg;
    const auto p = reinterpret_cast<std::uintptr_t>(&c);
    makecontext(&c.uc, reinterpret_cast<void (*)()>(&start_raw), 2, (unsigned)(p >> 32),
                (unsigned)(p & 0xffffffffu));
}

inline void swap_raw(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

#endif

/// The running OS thread's own context, to switch back to.
inline void make_main(Context& c) {
    c.main = true;
#if EMU_TSAN
    c.stack.tsan = __tsan_get_current_fiber();
#endif
}

/// Make `c` run `entry(arg)` on `stack` at its first switch. `entry` must call `started()`
/// first, and never return.
inline void make(Context& c, const Stack& stack, void (*entry)(void*), void* arg) {
    c.stack = stack;
    make_raw(c, entry, arg);
}

/// A fiber's first act: finish the switch that entered it.
inline void started() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &t_main_low, &t_main_size);
#endif
}

/// Save the running context in `from` and run `to`; returns when `from` is switched to again.
/// The contexts are bookkeeping, read untracked (and no ignore scope stays open across the
/// switch: a fiber's ignores are its own, and one left suspended inside one is reported).
inline void swap(Context& from, Context& to) {
    bool from_main, to_main;
    [[maybe_unused]] void *to_low, *to_tsan;
    {
        Untracked u;
        from_main = from.main;
        to_main = to.main;
        to_low = to.stack.low;
        to_tsan = to.stack.tsan;
    }
#if EMU_TSAN
    __tsan_switch_to_fiber(to_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASAN
    void* fake = nullptr;
    if (to_main) {
        __sanitizer_start_switch_fiber(&fake, t_main_low, t_main_size);
    } else {
        __sanitizer_start_switch_fiber(&fake, to_low, kStackBytes);
    }
#endif
    swap_raw(from, to);
#if EMU_ASAN
    if (from_main) {
        __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
    } else {
        __sanitizer_finish_switch_fiber(fake, &t_main_low, &t_main_size);
    }
#endif
    (void)from_main;
    (void)to_main;
}

}  // namespace emu::fiber
