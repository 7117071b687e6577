#include "py_lists.h"

#include <algorithm>
#include <cstdint>

namespace fastbert {

namespace {

PyObject* new_list(size_t n) {
    PyObject* l = PyList_New(static_cast<Py_ssize_t>(n));
    if (!l) throw PythonError();
    return l;
}

// n more references to o, at once.
void add_refs(PyObject* o, uint64_t n) {
    if (!n) return;
#if defined(Py_GIL_DISABLED)
    for (uint64_t i = 0; i < n; ++i) Py_INCREF(o);  // split reference counts: no single field to add to
#else
    Py_SET_REFCNT(o, Py_REFCNT(o) + static_cast<Py_ssize_t>(n));  // 3.12+: leaves immortal objects alone
#endif
}

// The items of the int lists: references lent by the table (pad_id may lie beyond it).
struct Lend {
    IntTable& ints;
    PyObject* pad_obj;
    bool pad_in_table;
    size_t pad_id;
    PyObject* id(int32_t i) { return ints.lend(static_cast<size_t>(i)); }
    PyObject* zero() { return ints.lend(0); }
    PyObject* one() { return ints.lend(1); }
    PyObject* pad() {
        if (pad_in_table) return ints.lend(pad_id);
        Py_INCREF(pad_obj);
        return pad_obj;
    }
};

struct Geometry {
    size_t len, s0, w, lo;
};

inline Geometry geometry(const Rows& rs, size_t r, size_t width, bool pad_left) {
    const size_t len = rs.len(r), w = std::max(len, width);
    return Geometry{len, rs.start[r], w, pad_left ? w - len : 0};
}

// Writes the int lists of row r of rs, output row k (the lists exist, their items unset).
void fill_row(const Rows& rs, size_t r, size_t k, size_t width, const EncodeOptions& o, const RowLists& out,
              Lend& items) {
    const Geometry g = geometry(rs, r, width, o.pad_left);
    auto fill = [&](PyObject* outer, auto pad, auto value) {
        PyObject* l = PyList_GET_ITEM(outer, static_cast<Py_ssize_t>(k));
        for (size_t t = 0; t < g.w; ++t)
            PyList_SET_ITEM(l, static_cast<Py_ssize_t>(t),
                            (t >= g.lo && t < g.lo + g.len) ? value(g.s0 + t - g.lo) : pad());
    };
    auto pad_v = [&] { return items.pad(); };
    auto zero_v = [&] { return items.zero(); };
    auto one_v = [&] { return items.one(); };
    fill(out.ids, pad_v, [&](size_t i) { return items.id(rs.ids[i]); });
    if (out.type_ids) fill(out.type_ids, zero_v, [&](size_t i) { return rs.type_ids[i] ? one_v() : zero_v(); });
    if (out.attention) fill(out.attention, zero_v, [&](size_t) { return one_v(); });
    if (out.special) fill(out.special, one_v, [&](size_t i) { return rs.special[i] ? one_v() : zero_v(); });
}

}  // namespace

void IntTable::settle(Entry& e) {
    add_refs(e.obj, e.lent);
    e.lent = 0;
}

IntTable::IntTable(size_t n) {
    table_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        PyObject* v = PyLong_FromSize_t(i);
        if (!v) break;
        table_.push_back(Entry{v, 0});
    }
    if (table_.size() == n && n) zero_pair_ = PyTuple_Pack(2, table_[0].obj, table_[0].obj);
    if (!zero_pair_) {  // a constructor that throws runs no destructor: drop what was made
        for (Entry& e : table_) Py_DECREF(e.obj);
        table_.clear();
        throw PythonError();
    }
    // 3.12+: Py_SET_REFCNT leaves immortal objects (the small ints) alone, here and in ~IntTable
    if constexpr (kBias != 0)
        for (Entry& e : table_) Py_SET_REFCNT(e.obj, Py_REFCNT(e.obj) + kBias);
}

IntTable::~IntTable() {
    Py_XDECREF(zero_pair_);
    for (Entry& e : table_) {
        settle(e);  // every lent reference counted: the count is exact once the bias is gone
        if constexpr (kBias != 0) Py_SET_REFCNT(e.obj, Py_REFCNT(e.obj) - kBias);
        Py_DECREF(e.obj);
    }
}

PyObject* IntTable::new_ref(size_t v) const {
    if (v < table_.size()) {
        Py_INCREF(table_[v].obj);
        return table_[v].obj;
    }
    PyObject* o = PyLong_FromSize_t(v);
    if (!o) throw PythonError();
    return o;
}

RowLists::~RowLists() {
    Py_XDECREF(ids);
    Py_XDECREF(type_ids);
    Py_XDECREF(attention);
    Py_XDECREF(special);
    Py_XDECREF(offsets);
    Py_XDECREF(words);
}

ListBuilder::ListBuilder(size_t rows, size_t width, const EncodeOptions& o, IntTable& ints)
    : o_(o), ints_(ints), rows_(rows), width_(o.padding != Padding::kNone ? width : 0) {
    pad_.obj = ints.new_ref(static_cast<size_t>(o.pad_id));
    out_.ids = new_list(rows);
    if (o.type_ids) out_.type_ids = new_list(rows);
    if (o.attention_mask) out_.attention = new_list(rows);
    if (o.special_tokens_mask) out_.special = new_list(rows);
    if (o.offsets) out_.offsets = new_list(rows);
    if (o.words) out_.words = new_list(rows);
}

void ListBuilder::add(const Rows& rs) {
    if (rs.rows() > rows_ - next_) {
        PyErr_SetString(PyExc_RuntimeError, "fastbert: a batch made more rows than its lists were made for");
        throw PythonError();
    }
    const EncodeOptions& o = o_;
    IntTable& ints = ints_;
    PyObject* zero_pair = ints.zero_pair();
    const size_t pad_id = static_cast<size_t>(o.pad_id);
    Lend items{ints, pad_.obj, pad_id < ints.size(), pad_id};

    // Every row list, each filled as soon as it exists (still in this core's cache). Filling them on
    // the pool without the GIL was slower on 2 cores (the lists are allocated here, so the other
    // core pulls every cache line of them across; and it had to count references per task).
    // Row lists hold only ints (or tuples of ints): they can never be part of a reference cycle,
    // so they are untracked (as CPython does for such tuples), and the cyclic GC never walks them.
    for (size_t r = 0; r < rs.rows(); ++r) {
        const size_t k = next_++;
        const Geometry g = geometry(rs, r, width_, o.pad_left);
        for (PyObject* outer : {out_.ids, out_.type_ids, out_.attention, out_.special}) {
            if (!outer) continue;
            PyObject* l = new_list(g.w);
            PyObject_GC_UnTrack(l);
            PyList_SET_ITEM(outer, static_cast<Py_ssize_t>(k), l);
        }
        fill_row(rs, r, k, width_, o, out_, items);
        if (out_.offsets) {
            PyObject* l = new_list(g.w);
            PyList_SET_ITEM(out_.offsets, static_cast<Py_ssize_t>(k), l);
            for (size_t t = 0; t < g.w; ++t) {
                PyObject* v = zero_pair;
                if (t >= g.lo && t < g.lo + g.len) {
                    const size_t i = g.s0 + t - g.lo;
                    const uint32_t a = rs.offsets[2 * i], b = rs.offsets[2 * i + 1];
                    if (a || b) {
                        PyObject* pa = ints.new_ref(a);
                        PyObject* pb = ints.new_ref(b);
                        v = PyTuple_Pack(2, pa, pb);
                        Py_DECREF(pa);
                        Py_DECREF(pb);
                        if (!v) throw PythonError();
                        PyList_SET_ITEM(l, static_cast<Py_ssize_t>(t), v);
                        continue;
                    }
                }
                Py_INCREF(v);
                PyList_SET_ITEM(l, static_cast<Py_ssize_t>(t), v);
            }
        }
        if (out_.words) {
            PyObject* l = new_list(g.w);
            PyList_SET_ITEM(out_.words, static_cast<Py_ssize_t>(k), l);
            for (size_t t = 0; t < g.w; ++t) {
                const int32_t word = (t >= g.lo && t < g.lo + g.len) ? rs.words[g.s0 + t - g.lo] : -1;
                PyObject* v = Py_None;
                if (word >= 0) v = ints.new_ref(static_cast<size_t>(word));
                else Py_INCREF(v);
                PyList_SET_ITEM(l, static_cast<Py_ssize_t>(t), v);
            }
            PyObject_GC_UnTrack(l);
        }
    }
}

}  // namespace fastbert
