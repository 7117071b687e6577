// The list outputs of encode_batch (rows as Python lists of ints), with the Python C API only
// (pybind11 stays in bindings.cpp). Call with the GIL held; large batches are filled on the
// tokenizer's threads with the GIL released.
#pragma once
#include <Python.h>

#include <cstddef>
#include <vector>

#include "encode_options.h"
#include "output_layout.h"
#include "post_processor.h"

namespace fastbert {

// A Python error is set; the caller raises it (py::error_already_set).
struct PythonError {};

// PyLong objects for 0..n-1, made once per tokenizer: a list item is then a pointer store and a
// reference count, never a new int object (CPython caches only -5..256).
class IntTable {
 public:
    explicit IntTable(size_t n);
    ~IntTable();
    IntTable(const IntTable&) = delete;
    IntTable& operator=(const IntTable&) = delete;
    size_t size() const { return ints_.size(); }
    PyObject* borrowed(size_t v) const { return ints_[v]; }  // v < size()
    PyObject* new_ref(size_t v) const;                        // any v
    PyObject* zero_pair() const { return zero_pair_; }        // (0, 0): the offsets of special tokens

 private:
    std::vector<PyObject*> ints_;
    PyObject* zero_pair_ = nullptr;
};

// New references (or null when not asked for) to the outer lists, one row list per row.
struct RowLists {
    PyObject* ids = nullptr;
    PyObject* type_ids = nullptr;
    PyObject* attention = nullptr;
    PyObject* special = nullptr;
    PyObject* offsets = nullptr;  // rows of (start, end) tuples
    PyObject* words = nullptr;    // rows of word indices (None for special tokens and padding)
    ~RowLists();
};

// Builds the rows as lists, padded to layout.width when the options pad. Throws PythonError.
// without_gil runs a function with the GIL released (bindings.cpp's helper).
void build_lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const IntTable& ints,
                 const ParallelFor& run, const std::function<void(const std::function<void()>&)>& without_gil,
                 RowLists& out);

}  // namespace fastbert
