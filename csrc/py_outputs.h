// The Python outputs of encode_batch, one strategy per output kind: numpy arrays padded to a width
// or packed back to back (their memory pooled), lists of ints, and the extras (length, windows,
// overflow_to_sample_mapping). Arrays whose shape is known before encoding are filled by the
// threads that encode, lists of a fixed width built chunk by chunk while the pool encodes the rest.
// The loops that write rows are output_layout's and py_lists'; this file makes the Python objects.
// Call with the GIL held.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "encode_options.h"
#include "output_layout.h"
#include "py_lists.h"
#include "stage_clock.h"
#include "tokenizer.h"

namespace fastbert {

namespace py = pybind11;

class BufferPool;

// One tokenizer's output machinery: the pool of array buffers, the ints for lists, the dict keys.
class Outputs {
 public:
    explicit Outputs(size_t int_count);  // ints 0..int_count-1 made once (IntTable)
    ~Outputs();
    Outputs(const Outputs&) = delete;
    Outputs& operator=(const Outputs&) = delete;

    // The padded int64 arrays the options ask for, rows x width (offsets rows x width x 2), put in out.
    PadOut padded_arrays(size_t rows, size_t width, const EncodeOptions& o, py::dict& out);
    // Packed output: 1-D arrays of every row's real tokens back to back, cu_seqlens and max_seqlen.
    void packed(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const ParallelFor& run,
                py::dict& out);
    // Every row as lists, built after encoding.
    void lists(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, py::dict& out);
    void put_lists(const RowLists& l, py::dict& out);
    // length, windows and overflow_to_sample_mapping, as the options ask.
    void extras(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, py::dict& out);
    IntTable& ints() { return *ints_; }

 private:
    py::object int_obj(size_t v) const;

    std::shared_ptr<BufferPool> pool_;
    std::unique_ptr<IntTable> ints_;
    // output keys, made (and hashed) once instead of per call
    struct Keys {
        py::str input_ids{"input_ids"}, token_type_ids{"token_type_ids"}, attention_mask{"attention_mask"},
            special_tokens_mask{"special_tokens_mask"}, offset_mapping{"offset_mapping"}, word_ids{"word_ids"},
            length{"length"}, windows{"windows"}, overflow_to_sample_mapping{"overflow_to_sample_mapping"},
            position_ids{"position_ids"}, cu_seqlens{"cu_seqlens"}, max_seqlen{"max_seqlen"};
    } keys_;
};

// The outputs of one encode_batch call of n items: made before encoding, it sets the hooks that
// fill arrays and build lists while the batch is encoded; finish() makes the rest once the layout
// is known. Lives until the call returns (the hooks point into it).
class BatchOutput {
 public:
    // gil_released: the batch is encoded without the GIL (the list hook then takes it per chunk).
    BatchOutput(Outputs& outputs, const EncodeOptions& o, size_t n, bool gil_released, const std::vector<Rows>& rows,
                Tokenizer::ChunkHooks& hooks, StageClock& clock);
    BatchOutput(const BatchOutput&) = delete;
    BatchOutput& operator=(const BatchOutput&) = delete;
    py::dict finish(const Layout& layout, const ParallelFor& run, StageClock& clock);

 private:
    Outputs& outputs_;
    const EncodeOptions& o_;
    const std::vector<Rows>& rows_;
    py::dict out_;
    bool fill_early_ = false;  // padded arrays filled by the encoding threads
    size_t early_width_ = 0;
    PadOut early_;
    std::unique_ptr<ListBuilder> builder_;  // lists built chunk by chunk on the calling thread
};

}  // namespace fastbert
