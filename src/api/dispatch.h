// The one call from a front end into a backend: picks the backend of the device and names the user's
// operation in every error the backend raises.
#pragma once

#include <sparsegrid/context.h>

#include "backend/backend.h"

#include <new>
#include <string>

namespace sparsegrid::detail {

/// Raises the uniform "not compiled" error for a device without a backend in this build.
[[noreturn]] void throw_backend_unavailable(const char* op, Device device);

/// fn(backend) with backend a CpuBackend or CudaBackend value for `device` (call its entry points as
/// backend.name(...)). An Error from the backend is raised again as "<op>: <message>".
template <typename Fn>
decltype(auto) on_backend(const char* op, Device device, Fn&& fn) {
#if !defined(SPARSEGRID_WITH_CUDA)
    if (!device.is_cpu()) throw_backend_unavailable(op, device);
#endif
    try {
#if defined(SPARSEGRID_WITH_CUDA)
        if (!device.is_cpu()) return fn(CudaBackend{});
#endif
        return fn(CpuBackend{});
    } catch (const Error& error) {
        throw Error(std::string(op) + ": " + error.what());
    } catch (const std::bad_alloc&) {
        // Host memory of std containers (device memory and PyTorch's allocators fail with errors of their own).
        throw Error(std::string(op) +
                    ": out of host memory (the output or its candidates are too large for "
                    "this machine; the README's \"Sizes and memory\" says what each step needs)");
    }
}

}  // namespace sparsegrid::detail
