// The GIL and the cyclic GC around a batch's work, with the Python C API only. Call with the GIL held.
#pragma once
#include <Python.h>

#ifdef __GLIBCXX__
#include <cxxabi.h>
#endif

#include <chrono>
#include <exception>
#include <thread>

namespace fastbert {

// Takes the GIL back. During interpreter exit, Python 3.11-3.13 end a daemon thread that asks for
// it with pthread_exit, a forced unwind. Unwinding the call would release its Python objects (the
// lists built so far, the output dict) without the GIL while the main thread tears the interpreter
// down, and crash the process. Such a thread is parked instead until the process ends (Python 3.14
// parks daemon threads itself).
inline void take_gil(PyThreadState* state) {
#ifdef __GLIBCXX__
    try {
        PyEval_RestoreThread(state);
    } catch (abi::__forced_unwind&) {
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
#else
    PyEval_RestoreThread(state);
#endif
}

// Runs f with the GIL released. Deliberately not py::gil_scoped_release, whose destructor takes the
// GIL back without take_gil.
template <class F>
void without_gil(F&& f) {
    PyThreadState* state = PyEval_SaveThread();
    std::exception_ptr error;
    try {
        f();
#ifdef __GLIBCXX__
    } catch (abi::__forced_unwind&) {
        throw;  // a forced unwind must go on (catch (...) below would swallow it and abort)
#endif
    } catch (...) {
        error = std::current_exception();
    }
    take_gil(state);
    if (error) std::rethrow_exception(error);
}

// Pauses Python's cyclic GC while it lives (restored also when an exception leaves the scope).
struct GcPause {
#if PY_VERSION_HEX >= 0x030A0000
    const int was_enabled = PyGC_Disable();
    ~GcPause() {
        if (was_enabled) PyGC_Enable();
    }
#endif
};

}  // namespace fastbert
