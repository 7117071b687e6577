// The list outputs of encode_batch (rows as Python lists of ints), with the Python C API only
// (no pybind11). Call with the GIL held.
#pragma once
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "encode_options.h"
#include "output_layout.h"
#include "post_processor.h"

namespace fastbert {

// A Python error is set; the caller raises it (py::error_already_set).
struct PythonError {};

// PyLong objects for 0..n-1, made once per tokenizer: a list item is then a pointer store, never
// a new int object (CPython caches only -5..256).
//
// A reference per list item would also write to that int's reference count: one write, in memory
// scattered over the whole table, for every id in a batch's lists. Instead each int's count holds
// a fixed bias (kBias, as CPython's immortal objects do), and the table counts the references it
// lends beside the pointer to the int. A lent count is added to the int's own count when it
// reaches kSettleAt and when the table dies, so an int's count never drops below kBias - kSettleAt
// while the table lives, and is exact again once it is gone. All of it with the GIL held.
class IntTable {
 public:
    explicit IntTable(size_t n);
    ~IntTable();
    IntTable(const IntTable&) = delete;
    IntTable& operator=(const IntTable&) = delete;
    size_t size() const { return table_.size(); }
    PyObject* borrowed(size_t v) const { return table_[v].obj; }  // v < size()
    // A reference for a list item, v < size().
    PyObject* lend(size_t v) {
        Entry& e = table_[v];
        if (++e.lent >= kSettleAt) settle(e);
        return e.obj;
    }
    PyObject* new_ref(size_t v) const;    // any v, a reference counted in the int itself
    PyObject* zero_pair() const { return zero_pair_; }  // (0, 0): the offsets of special tokens

 private:
#if defined(Py_GIL_DISABLED)
    // split reference counts, no field to bias: every reference is counted at once
    static constexpr Py_ssize_t kBias = 0;
    static constexpr uint64_t kSettleAt = 1;
#else
    static constexpr Py_ssize_t kBias = Py_ssize_t{1} << 30;  // below 2**31: mortal for 3.12+ too
    static constexpr uint64_t kSettleAt = uint64_t{1} << 24;
#endif
    struct Entry {
        PyObject* obj;
        uint64_t lent;  // references lent and not yet added to obj's count
    };
    static void settle(Entry& e);
    std::vector<Entry> table_;
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
    RowLists() = default;
    RowLists(const RowLists&) = delete;
    RowLists& operator=(const RowLists&) = delete;
    ~RowLists();
};

// Builds the outer lists of `rows` rows, then each chunk's row lists as its rows come (add, in
// order), each row padded to `width` when the options pad (0: no padding). Throws PythonError.
class ListBuilder {
 public:
    ListBuilder(size_t rows, size_t width, const EncodeOptions& o, IntTable& ints);
    ListBuilder(const ListBuilder&) = delete;
    ListBuilder& operator=(const ListBuilder&) = delete;
    void add(const Rows& rs);  // the next chunk's rows
    size_t filled() const { return next_; }
    RowLists& lists() { return out_; }

 private:
    const EncodeOptions& o_;
    IntTable& ints_;
    size_t rows_, width_, next_ = 0;
    struct Owned {
        PyObject* obj = nullptr;
        ~Owned() { Py_XDECREF(obj); }
    } pad_;  // pad_id's int (pad_id may lie beyond the table)
    RowLists out_;
};

}  // namespace fastbert
