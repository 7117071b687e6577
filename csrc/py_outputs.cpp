// See py_outputs.h.
#include "py_outputs.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "py_gil.h"

namespace fastbert {

namespace {

// A LayoutTooLarge as a MemoryError that names the shape: never a size that overflows or an
// allocation that fails halfway through the outputs.
[[noreturn]] void raise_too_large(const LayoutTooLarge& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
    throw py::error_already_set();
}

}  // namespace

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

namespace {

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

}  // namespace

Outputs::Outputs(size_t int_count) : pool_(std::make_shared<BufferPool>()) {
    try {
        ints_.reset(new IntTable(int_count));
    } catch (const PythonError&) {
        throw py::error_already_set();
    }
}

Outputs::~Outputs() = default;

py::object Outputs::int_obj(size_t v) const {
    try {
        return py::reinterpret_steal<py::object>(ints_->new_ref(v));
    } catch (const PythonError&) {
        throw py::error_already_set();
    }
}

PadOut Outputs::padded_arrays(size_t rows, size_t width, const EncodeOptions& o, py::dict& out) {
    try {
        check_cells(rows, width);
    } catch (const LayoutTooLarge& e) {
        raise_too_large(e);
    }
    size_t bytes = 0;
    auto mk = [&](bool want, const py::str& key, bool pairs2 = false) -> int64_t* {
        if (!want) return nullptr;
        std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)};
        if (pairs2) shape.push_back(2);
        py::array_t<int64_t> a = pooled_array(pool_, shape);
        out[key] = a;
        bytes += static_cast<size_t>(a.nbytes());
        return a.mutable_data();
    };
    PadOut po;
    po.ids = mk(true, keys_.input_ids);
    po.type_ids = mk(o.type_ids, keys_.token_type_ids);
    po.attention = mk(o.attention_mask, keys_.attention_mask);
    po.special = mk(o.special_tokens_mask, keys_.special_tokens_mask);
    po.offsets = mk(o.offsets, keys_.offset_mapping, true);
    po.stream = bytes >= kStreamBytes;
    return po;
}

void Outputs::packed(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o,
                     const ParallelFor& run, py::dict& out) {
    const std::vector<py::ssize_t> flat{static_cast<py::ssize_t>(layout.tokens)};
    auto mk = [&](bool want, const py::str& key, std::vector<py::ssize_t> shape = {}) -> int64_t* {
        if (!want) return nullptr;
        py::array_t<int64_t> a = pooled_array(pool_, shape.empty() ? flat : shape);
        out[key] = a;
        return a.mutable_data();
    };
    PackedOut po;
    po.ids = mk(true, keys_.input_ids);
    po.type_ids = mk(o.type_ids, keys_.token_type_ids);
    po.position_ids = mk(true, keys_.position_ids);
    po.special = mk(o.special_tokens_mask, keys_.special_tokens_mask);
    po.offsets = mk(o.offsets, keys_.offset_mapping, {static_cast<py::ssize_t>(layout.tokens), 2});
    py::array_t<int32_t> cu(static_cast<py::ssize_t>(layout.rows + 1));
    po.cu_seqlens = cu.mutable_data();
    try {
        without_gil([&] { fill_packed(rows, po, run); });
    } catch (const LayoutTooLarge& e) {
        raise_too_large(e);
    }
    out[keys_.cu_seqlens] = cu;
    out[keys_.max_seqlen] = int_obj(layout.widest);
}

void Outputs::lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, py::dict& out) {
    // Thousands of new lists would trigger the cyclic GC again and again while we build
    // them; none of them can be part of a cycle, so pause it for the duration.
    GcPause pause;
    try {
        ListBuilder b(layout.rows, layout.width, o, *ints_);
        for (const Rows& rs : rows) b.add(rs);
        put_lists(b.lists(), out);
    } catch (const PythonError&) {
        throw py::error_already_set();
    }
}

void Outputs::put_lists(const RowLists& l, py::dict& out) {
    auto put = [&](const py::str& key, PyObject* v) {
        if (v) out[key] = py::reinterpret_borrow<py::object>(v);
    };
    put(keys_.input_ids, l.ids);
    put(keys_.token_type_ids, l.type_ids);
    put(keys_.attention_mask, l.attention);
    put(keys_.special_tokens_mask, l.special);
    put(keys_.offset_mapping, l.offsets);
    put(keys_.word_ids, l.words);
}

void Outputs::extras(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, py::dict& out) {
    if (o.length) {
        py::list lengths(layout.rows);
        size_t k = 0;
        const size_t width = o.padding != Padding::kNone ? layout.width : 0;
        for (const Rows& rs : rows)
            for (size_t r = 0; r < rs.rows(); ++r) lengths[k++] = int_obj(std::max(rs.len(r), width));
        out[keys_.length] = lengths;
    }
    if (o.words) {  // alignment: which windows of A and B each row holds, and A's token count
        py::list windows(layout.rows);
        size_t k = 0;
        for (const Rows& rs : rows)
            for (size_t r = 0; r < rs.rows(); ++r)
                windows[k++] = py::make_tuple(int_obj(rs.window[3 * r]), int_obj(rs.window[3 * r + 1]),
                                              int_obj(rs.window[3 * r + 2]));
        out[keys_.windows] = windows;
    }
    if (o.overflow) {
        py::list mapping(layout.rows);
        size_t k = 0;
        for (const Rows& rs : rows)
            for (size_t r = 0; r < rs.rows(); ++r) mapping[k++] = int_obj(rs.item[r]);
        out[keys_.overflow_to_sample_mapping] = mapping;
    }
}

BatchOutput::BatchOutput(Outputs& outputs, const EncodeOptions& o, size_t n, bool gil_released,
                         const std::vector<Rows>& rows, Tokenizer::ChunkHooks& hooks, StageClock& clock)
    : outputs_(outputs), o_(o), rows_(rows) {
    // Padded arrays whose shape is known before encoding (padding="max_length", rows cut to
    // fit, one row per item) are filled by the thread that encoded each chunk, right after it and
    // while its rows are in that core's cache, not in a second parallel pass after the batch.
    fill_early_ = o.numpy && !o.packed && !o.overflow && !o.words && o.padding == Padding::kMaxLength &&
                  o.truncation != Truncation::kNone;
    if (fill_early_) {
        early_width_ = padded_width(o, 0);
        early_ = outputs_.padded_arrays(n, early_width_, o, out_);
        hooks.encoded = [this](const Rows& rs) {
            if (rs.rows()) fill_padded_rows(rs, static_cast<size_t>(rs.item[0]), early_width_, o_, early_);
        };
        clock.mark(kOutputGil);
    }
    // Lists whose shape is known before encoding (one row per item, a fixed width) are built
    // chunk by chunk on this thread, with the GIL taken back for each chunk, while the pool
    // encodes the chunks after it: building them was the largest serial step of a batch.
    if (!o.packed && !o.numpy && !o.overflow && o.padding != Padding::kLongest) {
        const size_t width = o.padding == Padding::kMaxLength ? padded_width(o, 0) : 0;
        try {
            check_cells(n, width);
            builder_.reset(new ListBuilder(n, width, o, outputs_.ints()));
        } catch (const LayoutTooLarge& e) {
            raise_too_large(e);
        } catch (const PythonError&) {
            throw py::error_already_set();
        }
        PyThreadState* const state = PyThreadState_Get();
        hooks.consume = [this, gil_released, state](size_t c) {
            // at interpreter exit this may not return (see take_gil): nothing to undo yet
            if (gil_released) take_gil(state);
            try {
                GcPause pause;
                builder_->add(rows_[c]);
            } catch (...) {
                if (gil_released) PyEval_SaveThread();
                throw;
            }
            if (gil_released) PyEval_SaveThread();
        };
    }
}

py::dict BatchOutput::finish(const Layout& layout, const ParallelFor& run, StageClock& clock) {
    if (o_.packed) {
        outputs_.packed(rows_, layout, o_, run, out_);
    } else if (fill_early_ && layout.rect) {
        // filled while encoding (a row longer than the width, e.g. max_length below the
        // special tokens' count, leaves the layout ragged: the lists below then)
    } else if (o_.numpy && layout.rect && !o_.words) {
        const PadOut po = outputs_.padded_arrays(layout.rows, layout.width, o_, out_);
        clock.mark(kOutputGil);
        without_gil([&] { fill_padded(rows_, layout, o_, po, run); });
        clock.mark(kOutputThreads);
    } else if (builder_) {
        if (builder_->filled() != layout.rows)
            throw std::logic_error("fastbert: " + std::to_string(layout.rows) + " rows, " +
                                   std::to_string(builder_->filled()) + " of them as lists");
        outputs_.put_lists(builder_->lists(), out_);
    } else {
        out_ = py::dict();  // without the arrays filled early, when the rows did not fit them
        outputs_.lists(rows_, layout, o_, out_);
    }
    clock.mark(kOutputGil);
    outputs_.extras(rows_, layout, o_, out_);
    clock.mark(kExtras);
    return out_;
}

}  // namespace fastbert
