#include "vocab.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fastbert {

Vocab Vocab::from_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open vocabulary file " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string data = ss.str();
    std::vector<std::string> tokens;
    size_t start = 0;
    for (size_t i = 0; i < data.size(); ++i) {
        if (data[i] == '\n' || data[i] == '\r') {
            tokens.emplace_back(data, start, i - start);
            if (data[i] == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
            start = i + 1;
        }
    }
    if (start < data.size()) tokens.emplace_back(data, start, data.size() - start);
    return Vocab(std::move(tokens));
}

Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
    map_.reserve(tokens_.size());
    // a repeated token maps to its last line, as a Python dict built line by line does
    for (size_t i = 0; i < tokens_.size(); ++i) map_.insert(tokens_[i], static_cast<int32_t>(i), true);
}

int32_t Vocab::add(const std::string& token) {
    int32_t existing = id(token);
    if (existing >= 0) return existing;
    tokens_.push_back(token);
    int32_t id = static_cast<int32_t>(tokens_.size() - 1);
    map_.insert(token, id, true);
    return id;
}

}  // namespace fastbert
