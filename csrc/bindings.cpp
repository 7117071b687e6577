// The only file that includes pybind11: module fastbert._C.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
    m.doc() = "fastbert C++ core: WordPiece tokenizer";
}
