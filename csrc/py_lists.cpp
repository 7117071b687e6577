#include "py_lists.h"

#include <algorithm>
#include <cstdint>

namespace fastbert {

namespace {

// Below this many list cells a batch is filled on the calling thread, the table lending a
// reference per cell; above it, on the pool without the GIL, counting references per distinct int.
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

// References lent by the table (the serial path, with the GIL).
struct Lend {
    IntTable& ints;
    PyObject* pad;
    bool pad_in_table;
    size_t pad_id;
    PyObject* id(PyObject*, int32_t i) { return ints.lend(static_cast<size_t>(i)); }
    PyObject* take_zero() { return ints.lend(0); }
    PyObject* take_one() { return ints.lend(1); }
    PyObject* take_pad() {
        if (pad_in_table) return ints.lend(pad_id);
        Py_INCREF(pad);
        return pad;
    }
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

void IntTable::settle(Entry& e) {
    add_refs(e.obj, e.lent);
    e.lent = 0;
}

void IntTable::add_lent(size_t v, uint64_t n) {
    Entry& e = table_[v];
    e.lent += n;
    if (e.lent >= kSettleAt) settle(e);
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
    for (Entry& e : table_) Py_SET_REFCNT(e.obj, Py_REFCNT(e.obj) + kBias);
}

IntTable::~IntTable() {
    Py_XDECREF(zero_pair_);
    for (Entry& e : table_) {
        settle(e);  // every lent reference counted: the count is exact once the bias is gone
        Py_SET_REFCNT(e.obj, Py_REFCNT(e.obj) - kBias);
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

void build_lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, IntTable& ints,
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
    const size_t pad_id = static_cast<size_t>(o.pad_id);
    const bool pad_in_table = pad_id < ints.size();

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
        Lend refs{ints, pad, pad_in_table, pad_id};
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
    // 3. The references, lent once per distinct int and task (with the GIL again).
    for (const Count& c : counts) {
        for (int32_t i : c.touched) ints.add_lent(static_cast<size_t>(i), c.ids[static_cast<size_t>(i)]);
        ints.add_lent(0, c.zeros);
        ints.add_lent(1, c.ones);
        if (pad_in_table) ints.add_lent(pad_id, c.pads);
        else add_refs(pad, c.pads);
    }
}

}  // namespace fastbert
