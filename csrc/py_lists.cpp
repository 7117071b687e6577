#include "py_lists.h"

#include <algorithm>
#include <cstdint>

namespace fastbert {

namespace {

// Below this many list cells a batch is filled on the calling thread with one Py_INCREF per
// cell; above it, on the pool without the GIL, counting references per distinct int instead.
constexpr size_t kThreadedCells = size_t{1} << 14;

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

// References taken now (the serial path).
struct Incref {
    PyObject* zero;
    PyObject* one;
    PyObject* pad;
    PyObject* id(PyObject* o, int32_t) { return Py_INCREF(o), o; }
    PyObject* take_zero() { return Py_INCREF(zero), zero; }
    PyObject* take_one() { return Py_INCREF(one), one; }
    PyObject* take_pad() { return Py_INCREF(pad), pad; }
};

// References counted, added later under the GIL (the threaded path): no write to a shared int object.
struct Count {
    PyObject* zero;
    PyObject* one;
    PyObject* pad;
    std::vector<uint32_t> ids;      // per id
    std::vector<int32_t> touched;   // the ids counted at least once: step 3 visits only these, not
                                    // every int of the table (65,536 refcounts in cold memory)
    uint64_t zeros = 0, ones = 0, pads = 0;
    PyObject* id(PyObject* o, int32_t i) {
        if (!ids[static_cast<size_t>(i)]++) touched.push_back(i);
        return o;
    }
    PyObject* take_zero() { return ++zeros, zero; }
    PyObject* take_one() { return ++ones, one; }
    PyObject* take_pad() { return ++pads, pad; }
};

struct Geometry {
    size_t len, s0, w, lo;
};

inline Geometry geometry(const Rows& rs, size_t r, size_t width, bool pad_left) {
    const size_t len = rs.len(r), w = std::max(len, width);
    return Geometry{len, rs.start[r], w, pad_left ? w - len : 0};
}

// Writes the int rows of chunk c (their lists exist, items unset).
template <class Refs>
void fill_chunk(const Rows& rs, size_t k0, size_t width, const EncodeOptions& o, const IntTable& ints,
                const RowLists& out, Refs& refs) {
    for (size_t r = 0; r < rs.rows(); ++r) {
        const Geometry g = geometry(rs, r, width, o.pad_left);
        const Py_ssize_t k = static_cast<Py_ssize_t>(k0 + r);
        auto fill = [&](PyObject* outer, auto pad, auto value) {
            PyObject* l = PyList_GET_ITEM(outer, k);
            for (size_t t = 0; t < g.w; ++t)
                PyList_SET_ITEM(l, static_cast<Py_ssize_t>(t),
                                (t >= g.lo && t < g.lo + g.len) ? value(g.s0 + t - g.lo) : pad());
        };
        auto pad_v = [&] { return refs.take_pad(); };
        auto zero_v = [&] { return refs.take_zero(); };
        auto one_v = [&] { return refs.take_one(); };
        fill(out.ids, pad_v, [&](size_t i) { return refs.id(ints.borrowed(static_cast<size_t>(rs.ids[i])), rs.ids[i]); });
        if (out.type_ids) fill(out.type_ids, zero_v, [&](size_t i) { return rs.type_ids[i] ? one_v() : zero_v(); });
        if (out.attention) fill(out.attention, zero_v, [&](size_t) { return one_v(); });
        if (out.special) fill(out.special, one_v, [&](size_t i) { return rs.special[i] ? one_v() : zero_v(); });
    }
}

}  // namespace

IntTable::IntTable(size_t n) {
    ints_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        PyObject* v = PyLong_FromSize_t(i);
        if (!v) break;
        ints_.push_back(v);
    }
    if (ints_.size() == n && n) zero_pair_ = PyTuple_Pack(2, ints_[0], ints_[0]);
    if (!zero_pair_) {  // a constructor that throws runs no destructor: drop what was made
        for (PyObject* v : ints_) Py_DECREF(v);
        ints_.clear();
        throw PythonError();
    }
}

IntTable::~IntTable() {
    Py_XDECREF(zero_pair_);
    for (PyObject* v : ints_) Py_DECREF(v);
}

PyObject* IntTable::new_ref(size_t v) const {
    if (v < ints_.size()) {
        Py_INCREF(ints_[v]);
        return ints_[v];
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

void build_lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const IntTable& ints,
                 const ParallelFor& run, const std::function<void(const std::function<void()>&)>& without_gil,
                 RowLists& out) {
    const size_t total = layout.rows;
    const size_t width = o.padding != Padding::kNone ? layout.width : 0;
    out.ids = new_list(total);
    if (o.type_ids) out.type_ids = new_list(total);
    if (o.attention_mask) out.attention = new_list(total);
    if (o.special_tokens_mask) out.special = new_list(total);
    if (o.offsets) out.offsets = new_list(total);
    if (o.words) out.words = new_list(total);
    PyObject* zero = ints.borrowed(0);
    PyObject* one = ints.borrowed(1);
    PyObject* zero_pair = ints.zero_pair();
    struct Drop {
        PyObject* o;
        ~Drop() { Py_DECREF(o); }
    };
    PyObject* pad = ints.new_ref(static_cast<size_t>(o.pad_id));
    Drop drop_pad{pad};

    // 1. Every row list, with the GIL: ints rows empty (filled in 2.), offsets and words complete.
    // Row lists hold only ints (or tuples of ints): they can never be part of a reference cycle,
    // so they are untracked (as CPython does for such tuples), and the cyclic GC never walks them.
    size_t cells = 0, k = 0;
    for (const Rows& rs : rows)
        for (size_t r = 0; r < rs.rows(); ++r, ++k) {
            const Geometry g = geometry(rs, r, width, o.pad_left);
            cells += g.w;
            for (PyObject* outer : {out.ids, out.type_ids, out.attention, out.special}) {
                if (!outer) continue;
                PyObject* l = new_list(g.w);
                PyObject_GC_UnTrack(l);
                PyList_SET_ITEM(outer, static_cast<Py_ssize_t>(k), l);
            }
            if (out.offsets) {
                PyObject* l = new_list(g.w);
                PyList_SET_ITEM(out.offsets, static_cast<Py_ssize_t>(k), l);
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
            if (out.words) {
                PyObject* l = new_list(g.w);
                PyList_SET_ITEM(out.words, static_cast<Py_ssize_t>(k), l);
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

    // 2. The int rows. Small batches: here, a reference at a time. Large ones: on the pool without
    // the GIL; the row lists are reachable from nothing but `out` until this returns, and they
    // hold borrowed pointers to IntTable's ints (alive as long as the tokenizer) until step 3.
    const std::vector<size_t> first = first_rows(rows);
    if (cells < kThreadedCells || o.num_threads <= 1 || rows.size() < 2 || layout.tokens >= UINT32_MAX) {
        Incref refs{zero, one, pad};
        for (size_t c = 0; c < rows.size(); ++c) fill_chunk(rows[c], first[c], width, o, ints, out, refs);
        return;
    }
    const size_t tasks = std::min(rows.size(), static_cast<size_t>(o.num_threads));
    std::vector<Count> counts(tasks, Count{zero, one, pad, {}});
    without_gil([&] {
        run(tasks, [&](size_t t) {
            Count& refs = counts[t];
            refs.ids.assign(ints.size(), 0);
            for (size_t c = rows.size() * t / tasks; c < rows.size() * (t + 1) / tasks; ++c)
                fill_chunk(rows[c], first[c], width, o, ints, out, refs);
        });
    });
    // 3. The references, once per distinct int and task (with the GIL again).
    for (const Count& c : counts) {
        for (int32_t i : c.touched) add_refs(ints.borrowed(static_cast<size_t>(i)), c.ids[static_cast<size_t>(i)]);
        add_refs(zero, c.zeros);
        add_refs(one, c.ones);
        add_refs(pad, c.pads);
    }
}

}  // namespace fastbert
