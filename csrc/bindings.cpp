// The only file that includes pybind11: module fastbert._C.
// Converts Python inputs to UTF-8 views (with the GIL), runs the batch without the GIL, and
// builds outputs: numpy buffers filled in C++, or lists made from cached Python ints.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer.h"

namespace py = pybind11;
using namespace fastbert;

namespace {

// Runs f with the GIL released. Deliberately not py::gil_scoped_release: at interpreter exit a
// daemon thread that takes the GIL back is ended by a forced unwind (pthread_exit), which aborts
// the process if it crosses a noexcept destructor such as gil_scoped_release's.
template <class F>
void without_gil(F&& f) {
    PyThreadState* state = PyEval_SaveThread();
    std::exception_ptr error;
    try {
        f();
    } catch (...) {
        error = std::current_exception();
    }
    PyEval_RestoreThread(state);
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

// Output buffers handed back to the tokenizer when their numpy arrays die, so the next batch
// writes into memory whose pages are already mapped: fresh multi-MB arrays cost more in page
// faults and kernel zeroing than the tokenization that fills them. Holds at most kMaxBytes.
class BufferPool {
 public:
    static constexpr size_t kMaxBytes = size_t{64} << 20;
    void* get(size_t n) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            size_t best = free_.size();
            for (size_t i = 0; i < free_.size(); ++i)
                if (free_[i].second >= n && free_[i].second <= 2 * n + 4096 &&
                    (best == free_.size() || free_[i].second < free_[best].second))
                    best = i;
            if (best < free_.size()) {
                void* p = free_[best].first;
                held_ -= free_[best].second;
                free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
                return p;
            }
        }
        void* p = std::malloc(n ? n : 1);
        if (!p) throw std::bad_alloc();
        return p;
    }
    void put(void* p, size_t n) {
        std::lock_guard<std::mutex> lock(mu_);
        if (n < (size_t{1} << 16) || held_ + n > kMaxBytes) {
            std::free(p);
            return;
        }
        free_.emplace_back(p, n);
        held_ += n;
    }
    ~BufferPool() {
        for (auto& f : free_) std::free(f.first);
    }

 private:
    std::mutex mu_;
    std::vector<std::pair<void*, size_t>> free_;
    size_t held_ = 0;
};

// An int64 numpy array whose memory comes from (and returns to) the pool.
py::array_t<int64_t> pooled_array(const std::shared_ptr<BufferPool>& pool, const std::vector<py::ssize_t>& shape) {
    size_t count = 1;
    for (py::ssize_t d : shape) count *= static_cast<size_t>(d);
    const size_t bytes = count * sizeof(int64_t);
    struct Holder {
        std::shared_ptr<BufferPool> pool;
        void* data;
        size_t bytes;
    };
    auto* h = new Holder{pool, pool->get(bytes), bytes};
    py::capsule owner(h, [](void* p) {
        auto* holder = static_cast<Holder*>(p);
        holder->pool->put(holder->data, holder->bytes);
        delete holder;
    });
    return py::array_t<int64_t>(shape, static_cast<int64_t*>(h->data), owner);
}

// A Python-owned tokenizer: the C++ tokenizer plus cached Python ints for building lists.
class PyTokenizer {
 public:
    // the most output cells (rows x padded width) a batch may ask for: beyond it (or an overflow
    // of rows x width x 8 bytes) the allocation could never succeed
    static constexpr size_t kMaxCells = size_t{1} << 40;
    PyTokenizer(py::object vocab, bool lowercase, bool strip_accents, bool handle_chinese_chars, bool clean_text,
                const std::string& unk_token, const std::string& prefix, size_t max_chars,
                const std::vector<std::tuple<std::string, bool, bool, bool, bool>>& added) {
        Vocab v;
        if (py::isinstance<py::str>(vocab)) {
            try {
                v = Vocab::from_file(vocab.cast<std::string>());
            } catch (const std::invalid_argument& e) {
                throw py::value_error(e.what());
            } catch (const std::runtime_error& e) {
                PyErr_SetFromErrnoWithFilename(PyExc_OSError, vocab.cast<std::string>().c_str());
                throw py::error_already_set();
            }
        } else {
            v = Vocab(vocab.cast<std::vector<std::string>>());
        }
        TokenizerConfig cfg;
        cfg.normalizer = NormalizerConfig{clean_text, handle_chinese_chars, strip_accents, lowercase};
        cfg.unk_token = unk_token;
        cfg.continuing_subword_prefix = prefix;
        cfg.max_input_chars_per_word = max_chars;
        std::vector<AddedToken> toks;
        for (const auto& a : added) {
            AddedToken t;
            t.content = std::get<0>(a);
            t.lstrip = std::get<1>(a);
            t.rstrip = std::get<2>(a);
            t.single_word = std::get<3>(a);
            t.normalized = std::get<4>(a);
            t.id = v.id(t.content);
            toks.push_back(t);
        }
        base_size_ = v.distinct();
        base_ids_ = v.size();
        try {
            tok_.reset(new Tokenizer(std::move(v), cfg, std::move(toks)));
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
        const size_t n = std::max<size_t>(tok_->vocab().size(), 65536);
        ints_.reserve(n);
        for (size_t i = 0; i < n; ++i) ints_.push_back(py::int_(i));
        zero_pair_ = py::make_tuple(0, 0);
    }

    // opts: the 19 options in the order read below (ints/bools), one tuple: a 21-argument
    // pybind11 signature costs most of this file's compile time. want_words (word index per
    // token, -1 -> None) needs want_offsets and gives lists: only the alignment methods ask.
    py::tuple encode_batch(py::object texts, py::object pairs, py::tuple opts) {
        if (py::len(opts) != 19) throw py::value_error("encode_batch: expected 19 options");
        auto opt = [&](size_t i) -> int64_t {  // ints or bools; straight from the tuple (per-call cost)
            const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(opts.ptr(), static_cast<Py_ssize_t>(i)));
            if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
            return v;
        };
        const bool split_words = opt(0), add_special_tokens = opt(1);
        const int truncation = static_cast<int>(opt(2));
        const size_t max_length = static_cast<size_t>(opt(3)), stride = static_cast<size_t>(opt(4));
        const bool truncate_left = opt(5);
        const int padding = static_cast<int>(opt(6));
        const size_t pad_to_multiple_of = static_cast<size_t>(opt(7));
        const bool pad_left = opt(8);
        const int64_t pad_id = opt(9);
        const int num_threads = static_cast<int>(opt(10));
        const bool want_type_ids = opt(11), want_attention = opt(12), want_special = opt(13),
                   want_offsets = opt(14), want_length = opt(15), want_overflow = opt(16), as_numpy = opt(17),
                   want_words = opt(18);
        if (want_words && !want_offsets) throw py::value_error("encode_batch: word ids need offsets");
        // This thread's input and row buffers, reused from its last batch (about 20 allocations
        // less per call: most of the C++ cost of one short text); a fresh set if they are in use
        // (a call made again from inside this one, by a finalizer the GC ran).
        Workspace own;
        Workspace& ws = workspace_.busy ? own : workspace_;
        struct Release {
            Workspace& ws;
            explicit Release(Workspace& w) : ws(w) { ws.busy = true; }
            ~Release() { ws.release(); }
        } release(ws);
        BatchInput& in = ws.in;
        in.split_words = split_words;
        py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(texts.ptr(), "texts must be a sequence"));
        if (!seq) throw py::error_already_set();
        const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        in.a.reserve(n + 1);
        in.segs.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            add_item(items[i], "batch", i, split_words, in, ws.refs);
            in.a.push_back(static_cast<uint32_t>(in.segs.size()));
        }
        if (!pairs.is_none()) {
            py::object pseq =
                py::reinterpret_steal<py::object>(PySequence_Fast(pairs.ptr(), "text_pair must be a sequence"));
            if (!pseq) throw py::error_already_set();
            if (static_cast<size_t>(PySequence_Fast_GET_SIZE(pseq.ptr())) != n)
                throw py::value_error("text and text_pair have different lengths");
            PyObject** pitems = PySequence_Fast_ITEMS(pseq.ptr());
            in.b.reserve(n + 1);
            in.b.push_back(static_cast<uint32_t>(in.segs.size()));
            for (size_t i = 0; i < n; ++i) {
                add_item(pitems[i], "text_pair", i, split_words, in, ws.refs);
                in.b.push_back(static_cast<uint32_t>(in.segs.size()));
            }
        }
        PostConfig cfg;
        cfg.add_special_tokens = add_special_tokens;
        cfg.cls_id = cls_id_;
        cfg.sep_id = sep_id_;
        cfg.truncation = static_cast<Truncation>(truncation);
        cfg.max_length = max_length;
        cfg.stride = stride;
        cfg.truncate_left = truncate_left;
        cfg.offsets = want_offsets;
        cfg.words = want_words;
        cfg.overflow = want_overflow;

        std::vector<Rows>& rows = ws.rows;
        size_t bytes = 0;
        for (const std::string_view& seg : in.segs) bytes += seg.size();
        try {
            // a short input is encoded in about the time that releasing and taking back the GIL takes
            if (bytes < kReleaseGilBytes)
                tok_->encode_batch(in, cfg, num_threads, rows);
            else
                without_gil([&] { tok_->encode_batch(in, cfg, num_threads, rows); });
        } catch (const TruncationError& e) {
            throw py::value_error(e.what());
        }
        // padded width: "longest" looks at the rows HF pads by (main rows), "max_length" is fixed
        size_t total = 0, longest = 0, shortest = SIZE_MAX;
        for (const Rows& rs : rows)
            for (size_t r = 0; r < rs.rows(); ++r) {
                ++total;
                if (rs.main[r]) longest = std::max(longest, rs.len(r));
                shortest = std::min(shortest, rs.len(r));
            }
        size_t width = padding == 1 ? longest : padding == 2 ? max_length : 0;
        if (padding && pad_to_multiple_of && width % pad_to_multiple_of)
            width += pad_to_multiple_of - width % pad_to_multiple_of;
        size_t widest = 0;
        for (const Rows& rs : rows)
            for (size_t r = 0; r < rs.rows(); ++r) widest = std::max(widest, rs.len(r));
        const bool rect = padding ? widest <= width : (total == 0 || widest == shortest);
        if (!padding) width = total ? widest : 0;
        // padding="max_length" with max_length=2**40: a MemoryError that names the shape, never a
        // size that overflows or an allocation that fails halfway through the outputs
        if (total && width > kMaxCells / total) {
            const std::string msg = "cannot pad " + std::to_string(total) + " rows to " + std::to_string(width) +
                                    " tokens: the outputs would not fit in memory (check max_length / "
                                    "pad_to_multiple_of)";
            PyErr_SetString(PyExc_MemoryError, msg.c_str());
            throw py::error_already_set();
        }

        py::dict out;
        if (as_numpy && rect && !want_words) {
            auto mk = [&](bool want, const py::str& key, bool pairs2 = false) -> int64_t* {
                if (!want) return nullptr;
                std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(total), static_cast<py::ssize_t>(width)};
                if (pairs2) shape.push_back(2);
                py::array_t<int64_t> a = pooled_array(pool_, shape);
                out[key] = a;
                return a.mutable_data();
            };
            PadOut po;
            po.ids = mk(true, keys_.input_ids);
            po.type_ids = mk(want_type_ids, keys_.token_type_ids);
            po.attention = mk(want_attention, keys_.attention_mask);
            po.special = mk(want_special, keys_.special_tokens_mask);
            po.offsets = mk(want_offsets, keys_.offset_mapping, true);
            PadSpec ps{width, pad_left, static_cast<int32_t>(pad_id)};
            without_gil([&] { tok_->fill_padded(rows, ps, po, num_threads); });
        } else {
            // Thousands of new lists would trigger the cyclic GC again and again while we build
            // them; none of them can be part of a cycle, so pause it for the duration.
            GcPause pause;
            build_lists(rows, total, padding ? width : 0, pad_left, pad_id, want_type_ids, want_attention,
                        want_special, want_offsets, want_words, out);
        }
        if (want_length) {
            py::list lengths(total);
            size_t k = 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r) lengths[k++] = int_obj(std::max(rs.len(r), padding ? width : 0));
            out[keys_.length] = lengths;
        }
        if (want_words) {  // alignment: which windows of A and B each row holds
            py::list windows(total);
            size_t k = 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r)
                    windows[k++] = py::make_tuple(int_obj(rs.window[2 * r]), int_obj(rs.window[2 * r + 1]));
            out[keys_.windows] = windows;
        }
        if (want_overflow) {
            py::list mapping(total);
            size_t k = 0;
            for (const Rows& rs : rows)
                for (size_t r = 0; r < rs.rows(); ++r) mapping[k++] = int_obj(rs.item[r]);
            out[keys_.overflow_to_sample_mapping] = mapping;
        }
        return py::make_tuple(out, widest);
    }

    py::object id_to_token(int64_t id) const {
        if (id < 0 || !tok_->vocab().has_id(static_cast<size_t>(id))) return py::none();
        return py::str(tok_->vocab().token(static_cast<size_t>(id)));
    }
    py::object token_to_id(const std::string& t) const {
        const int32_t id = tok_->token_id(t);
        if (id < 0) return py::none();
        return py::int_(id);
    }
    std::vector<std::string> tokens() const { return tok_->vocab().tokens(); }
    size_t size() const { return tok_->vocab().distinct(); }
    size_t base_size() const { return base_size_; }
    size_t base_ids() const { return base_ids_; }
    void clear_cache() { tok_->clear_cache(); }
    py::str normalize(const std::string& text) const {
        const std::string out = tok_->normalize(text);
        return py::str(out.data(), out.size());
    }
    void set_specials(int32_t cls, int32_t sep) {
        cls_id_ = cls;
        sep_id_ = sep;
    }

 private:
    py::object int_obj(size_t v) const {
        if (v < ints_.size()) return ints_[v];
        return py::int_(v);
    }

    // "batch item 3" / "text_pair item 3" or, for a pre-split word (word >= 0), "word 2 of batch item 3";
    // made only on error
    static std::string where(const char* what, size_t index, long word) {
        const std::string item = std::string(what) + " item " + std::to_string(index);
        return word < 0 ? item : "word " + std::to_string(word) + " of " + item;
    }

    void add_text(py::handle h, const char* what, size_t index, long word, BatchInput& in,
                  std::vector<PyObject*>& keep) {
        if (!PyUnicode_Check(h.ptr()))
            throw py::type_error(where(what, index, word) + " is " + std::string(Py_TYPE(h.ptr())->tp_name) +
                                 ", not str");
        Py_ssize_t len = 0;
        const char* p = PyUnicode_AsUTF8AndSize(h.ptr(), &len);
        if (!p) {
            PyErr_Clear();
            const Py_ssize_t n = PyUnicode_GetLength(h.ptr());
            for (Py_ssize_t j = 0; j < n; ++j) {
                Py_UCS4 c = PyUnicode_ReadChar(h.ptr(), j);
                if (c >= 0xD800 && c < 0xE000) {
                    char buf[16];
                    snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
                    throw py::value_error(where(what, index, word) + " has a lone surrogate " + buf + " at character " +
                                          std::to_string(j) + "; it cannot be encoded as UTF-8");
                }
            }
            throw py::value_error(where(what, index, word) + " cannot be encoded as UTF-8");
        }
        Py_INCREF(h.ptr());
        keep.push_back(h.ptr());
        in.segs.emplace_back(p, static_cast<size_t>(len));
    }

    void add_item(py::handle h, const char* what, size_t index, bool split_words, BatchInput& in,
                  std::vector<PyObject*>& keep) {
        if (!split_words) {
            add_text(h, what, index, -1, in, keep);
            return;
        }
        if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr()))
            throw py::type_error(where(what, index, -1) + " is " +
                                 std::string(Py_TYPE(h.ptr())->tp_name) +
                                 ", not a list of words (is_split_into_words=True)");
        long k = 0;
        for (py::handle w : py::reinterpret_borrow<py::sequence>(h)) add_text(w, what, index, k++, in, keep);
    }

    void build_lists(const std::vector<Rows>& rows, size_t total, size_t width, bool pad_left, int64_t pad_id,
                     bool want_type_ids, bool want_attention, bool want_special, bool want_offsets, bool want_words,
                     py::dict& out) {
        py::list ids(total), types(want_type_ids ? total : 0), attn(want_attention ? total : 0),
            special(want_special ? total : 0), offs(want_offsets ? total : 0), words(want_words ? total : 0);
        // Row lists hold only ints, so they can never be part of a reference cycle: untracking
        // them (as CPython does for such tuples and dicts) keeps the cyclic GC from walking
        // every row of every batch the user keeps.
        auto done = [](PyObject* list) { PyObject_GC_UnTrack(list); };
        PyObject* zero = ints_[0].ptr();
        PyObject* one = ints_[1].ptr();
        PyObject* pad = int_obj(static_cast<size_t>(pad_id)).release().ptr();
        size_t k = 0;
        for (const Rows& rs : rows) {
            for (size_t r = 0; r < rs.rows(); ++r, ++k) {
                const size_t len = rs.len(r), s0 = rs.start[r];
                const size_t w = std::max(len, width);
                const size_t lo = pad_left ? w - len : 0;
                auto fill = [&](PyObject* list, PyObject* padv, auto value) {
                    for (size_t t = 0; t < w; ++t) {
                        PyObject* v = (t >= lo && t < lo + len) ? value(s0 + t - lo) : padv;
                        Py_INCREF(v);
                        PyList_SET_ITEM(list, t, v);
                    }
                };
                PyObject* l = new_list(w);
                fill(l, pad, [&](size_t i) { return cached(rs.ids[i]); });
                done(l);
                PyList_SET_ITEM(ids.ptr(), k, l);
                if (want_type_ids) {
                    l = new_list(w);
                    fill(l, zero, [&](size_t i) { return rs.type_ids[i] ? one : zero; });
                    done(l);
                    PyList_SET_ITEM(types.ptr(), k, l);
                }
                if (want_attention) {
                    l = new_list(w);
                    fill(l, zero, [&](size_t) { return one; });
                    done(l);
                    PyList_SET_ITEM(attn.ptr(), k, l);
                }
                if (want_special) {
                    l = new_list(w);
                    fill(l, one, [&](size_t i) { return rs.special[i] ? one : zero; });
                    done(l);
                    PyList_SET_ITEM(special.ptr(), k, l);
                }
                if (want_offsets) {
                    l = new_list(w);
                    for (size_t t = 0; t < w; ++t) {
                        PyObject* v;
                        if (t >= lo && t < lo + len) {
                            const size_t i = s0 + t - lo;
                            const uint32_t a = rs.offsets[2 * i], b = rs.offsets[2 * i + 1];
                            v = (a == 0 && b == 0) ? (Py_INCREF(zero_pair_.ptr()), zero_pair_.ptr())
                                                   : PyTuple_Pack(2, owned_int(a).ptr(), owned_int(b).ptr());
                        } else {
                            v = zero_pair_.ptr();
                            Py_INCREF(v);
                        }
                        PyList_SET_ITEM(l, t, v);
                    }
                    PyList_SET_ITEM(offs.ptr(), k, l);
                }
                if (want_words) {
                    l = new_list(w);
                    for (size_t t = 0; t < w; ++t) {
                        const int32_t word = (t >= lo && t < lo + len) ? rs.words[s0 + t - lo] : -1;
                        PyObject* v = word < 0 ? (Py_INCREF(Py_None), Py_None)
                                               : int_obj(static_cast<size_t>(word)).release().ptr();
                        PyList_SET_ITEM(l, t, v);
                    }
                    done(l);
                    PyList_SET_ITEM(words.ptr(), k, l);
                }
            }
        }
        Py_DECREF(pad);
        out[keys_.input_ids] = ids;
        if (want_type_ids) out[keys_.token_type_ids] = types;
        if (want_attention) out[keys_.attention_mask] = attn;
        if (want_special) out[keys_.special_tokens_mask] = special;
        if (want_offsets) out[keys_.offset_mapping] = offs;
        if (want_words) out[keys_.word_ids] = words;
    }

    // A row list; on failure (MemoryError set) the exception propagates instead of a NULL write.
    static PyObject* new_list(size_t n) {
        PyObject* l = PyList_New(static_cast<Py_ssize_t>(n));
        if (!l) throw py::error_already_set();
        return l;
    }

    PyObject* cached(int32_t id) const { return ints_[static_cast<size_t>(id)].ptr(); }
    py::object owned_int(uint32_t v) const { return int_obj(v); }

    // Per-thread buffers of encode_batch (see there).
    struct Workspace {
        BatchInput in;
        // a reference to each input str the batch points into: another Python thread may change
        // the caller's list while the GIL is released
        std::vector<PyObject*> refs;
        std::vector<Rows> rows;
        bool busy = false;
        // Drops the input references, empties the buffers and keeps their memory, unless a large
        // batch grew them: an idle thread should not hold its largest batch's rows.
        void release() {
            for (PyObject* o : refs) Py_DECREF(o);
            refs.clear();
            size_t held = in.segs.capacity() * sizeof(std::string_view);
            for (const Rows& r : rows)
                held += r.ids.capacity() * sizeof(int32_t) + r.offsets.capacity() * sizeof(uint32_t);
            if (held > kKeepBytes) {
                *this = Workspace();
                return;
            }
            in.segs.clear();
            in.a.assign(1, 0);
            in.b.clear();
            busy = false;
        }
        static constexpr size_t kKeepBytes = size_t{1} << 20;
    };
    static thread_local Workspace workspace_;

    std::unique_ptr<Tokenizer> tok_;
    std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
    std::vector<py::object> ints_;
    py::object zero_pair_;
    // output keys, made (and hashed) once instead of per call
    struct Keys {
        py::str input_ids{"input_ids"}, token_type_ids{"token_type_ids"}, attention_mask{"attention_mask"},
            special_tokens_mask{"special_tokens_mask"}, offset_mapping{"offset_mapping"}, word_ids{"word_ids"},
            length{"length"}, windows{"windows"}, overflow_to_sample_mapping{"overflow_to_sample_mapping"};
    } keys_;
    static constexpr size_t kReleaseGilBytes = 2048;
    int32_t cls_id_ = 0, sep_id_ = 0;
    size_t base_size_ = 0;  // distinct tokens of the vocabulary file (HF's vocab_size)
    size_t base_ids_ = 0;   // its lines
};

thread_local PyTokenizer::Workspace PyTokenizer::workspace_;

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "fastbert C++ core: WordPiece tokenizer";
    py::class_<PyTokenizer>(m, "Tokenizer")
        .def(py::init<py::object, bool, bool, bool, bool, const std::string&, const std::string&, size_t,
                      const std::vector<std::tuple<std::string, bool, bool, bool, bool>>&>(),
             py::arg("vocab"), py::arg("lowercase"), py::arg("strip_accents"), py::arg("handle_chinese_chars"),
             py::arg("clean_text"), py::arg("unk_token"), py::arg("continuing_subword_prefix"),
             py::arg("max_input_chars_per_word"), py::arg("added_tokens"))
        .def("encode_batch", &PyTokenizer::encode_batch, py::arg("texts"), py::arg("pairs"), py::arg("options"))
        .def("id_to_token", &PyTokenizer::id_to_token)
        .def("token_to_id", &PyTokenizer::token_to_id)
        .def("tokens", &PyTokenizer::tokens)
        .def("set_specials", &PyTokenizer::set_specials)
        .def("base_size", &PyTokenizer::base_size)
        .def("base_ids", &PyTokenizer::base_ids)
        .def("clear_cache", &PyTokenizer::clear_cache)
        .def("normalize", &PyTokenizer::normalize, py::arg("text"))
        .def("__len__", &PyTokenizer::size);
}
