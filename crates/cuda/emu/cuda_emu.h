// The CUDA surface our kernels use, for the host C++ compiler (gpu-emu): the kernel sources of
// crates/cuda/kernels are compiled as ordinary C++ after this header and run on the CPU by
// emu_runtime.cpp, each CUDA thread a fiber of the launching OS thread (emu_fibers.h).
//
// Covered, and nothing more (a kernel using anything else fails to compile here):
//   threadIdx / blockIdx / blockDim / gridDim     per-thread values set by the runtime
//   __syncthreads()                               the block's barrier; returned threads drop out
//   __shfl_xor_sync(full mask, float, int)        through a per-warp exchange, a barrier on each
//                                                 side; reading a lane that returned is an error
//   atomicAdd(float*, float)                      a compare-and-swap loop (GCC/Clang __atomic
//                                                 builtins: older C++ libraries lack atomic_ref)
//   SHARED_ARRAY(T, name, [dims])                 static __shared__, one exact-size allocation
//                                                 per block (the .cu files use this macro)
//   DYNAMIC_SHARED(T, name)                       extern __shared__ T name[]: the launch's
//                                                 dynamic bytes, exact-size, per block
//   EMU_ENTRY(kernel)                             registers an extern "C" kernel with its
//                                                 parameter types, so a launch can call it
//                                                 through cuLaunchKernel's void** array
//   f16 conversions (round to nearest even), __int_as_float, __float_as_int, __umulhi, rsqrtf,
//   min, max, __dp4a (signed bytes), __float2int_rn (to nearest even), isfinite; the C math
//   library gives expf, tanhf, erff, fmaxf, fabsf, sqrtf, sincos.
// Shared memory starts as 0xff bytes (NaN floats, -1 ints): a kernel that reads shared memory
// before writing it sees garbage, as on a GPU. Every buffer is its own allocation, so the
// address sanitizer has redzones around each.
//
// Errors (a barrier some threads never reach, a shuffle from a returned lane, a partial mask,
// too much shared memory) abort the launch, which reports the first one to the caller.

#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};

// The built-in variables, set by the runtime before it switches to a CUDA thread's fiber.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local uint3 blockDim;
inline thread_local uint3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

namespace emu {

/// The block's barrier (__syncthreads).
void sync_block();
/// The value `v` of lane (this lane ^ lane_mask) of this warp; every lane of the warp must call.
float shfl_xor(unsigned mask, float v, int lane_mask);
/// The block's allocation for static shared array `key` (bytes long, 0xff-filled, made by the
/// first thread of the block to ask).
void* static_shared(int key, std::size_t bytes);
/// The block's dynamic shared memory (the launch's bytes; may be 0 long).
void* dynamic_shared();
/// Whether the calling CUDA thread's launch has already failed (for the self-test kernels).
bool launch_failed();

/// A kernel called with its parameters from an array of pointers to them.
using Invoker = void (*)(void** args);
/// Record kernel `name`: its invoker and the byte size of each parameter.
bool register_entry(const char* name, Invoker invoke, const std::size_t* sizes, std::size_t n);

template <typename F>
struct Params;

/// A kernel's parameter list: how many, their sizes, and a call that casts each `void*` to
/// the declared type (so the argument array's order, widths and layouts are what is tested).
template <typename... P>
struct Params<void (*)(P...)> {
    static constexpr std::size_t count = sizeof...(P);
    static constexpr std::size_t sizes[sizeof...(P) + 1] = {sizeof(P)..., 0};
    template <std::size_t... I>
    static void call(void (*f)(P...), void** args, std::index_sequence<I...>) {
        f(*static_cast<std::remove_cv_t<P>*>(args[I])...);
    }
};

template <auto F>
void invoke(void** args) {
    using T = Params<decltype(F)>;
    T::call(F, args, std::make_index_sequence<T::count>{});
}

inline float f16_to_f32(std::uint16_t h) {
    const std::uint32_t s = (std::uint32_t)(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    std::uint32_t bits;
    if (e == 0) {
        const float v = std::ldexp((float)m, -24);  // zero or subnormal: m * 2^-24, exact
        return s ? -v : v;
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// f32 -> f16 bits, round to nearest even (cvt.rn.f16.f32).
inline std::uint16_t f32_to_f16(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    const std::uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (std::uint16_t)(sign | 0x7e00u);  // NaN
    if (a >= 0x47800000u) return (std::uint16_t)(sign | 0x7c00u);  // >= 65536 (and inf): inf
    if (a < 0x38800000u) {                                          // below 2^-14: subnormal
        const std::uint32_t e = a >> 23;
        if (e < 102) return (std::uint16_t)sign;  // below 2^-25: rounds to zero
        const std::uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        std::uint32_t q = m >> shift;
        const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) ++q;
        return (std::uint16_t)(sign | q);
    }
    std::uint32_t h = ((((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13));
    const std::uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // a carry moves into the exponent
    return (std::uint16_t)(sign | h);
}

}  // namespace emu

inline void __syncthreads() { emu::sync_block(); }

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    return emu::shfl_xor(mask, v, lane_mask);
}

inline float atomicAdd(float* p, float v) {
    // The float's bits, swapped in when no other thread changed them meanwhile.
    std::uint32_t* bits = reinterpret_cast<std::uint32_t*>(p);
    std::uint32_t seen = __atomic_load_n(bits, __ATOMIC_RELAXED);
    for (;;) {
        float old;
        std::memcpy(&old, &seen, 4);
        const float sum = old + v;
        std::uint32_t next;
        std::memcpy(&next, &sum, 4);
        if (__atomic_compare_exchange_n(bits, &seen, next, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            return old;
        }
    }
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}

// The high 32 bits of the 64-bit product.
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// c + the sum of the four products of the signed bytes of a and b (byte k with byte k).
inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) {
        c += (int)(std::int8_t)(a >> (8 * k)) * (int)(std::int8_t)(b >> (8 * k));
    }
    return c;
}

// x rounded to the nearest int, ties to even (the default rounding mode; x must fit an int).
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }

using std::isfinite;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

#define SHARED_ARRAY(T, name, dims) \
    T(&name) dims = *static_cast<T(*) dims>(emu::static_shared(__COUNTER__, sizeof(T dims)))
#define DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(emu::dynamic_shared())
#define EMU_ENTRY(kernel)                                                                  \
    static const bool emu_entry_##kernel = emu::register_entry(                            \
        #kernel, &emu::invoke<&kernel>, emu::Params<decltype(&kernel)>::sizes,             \
        emu::Params<decltype(&kernel)>::count);
