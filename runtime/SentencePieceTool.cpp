// ape-spm: the runtime's SentencePiece helper, run as a separate process by runtime/Tokenizer.cpp.
//
//   ape-spm train --input=a.txt,b.txt --model_prefix=m --vocab_size=4096 ...   (SentencePiece flags)
//   ape-spm encode MODEL OUT BOOK...     books -> OUT (format below)
//   ape-spm decode MODEL IDS OUT         IDS (whitespace-separated ids) -> OUT (UTF-8 text; each
//                                        </s> id is a paragraph break, written as a blank line)
//
// Why a separate process: Debian's libsentencepiece.so.0 carries and exports its own protobuf-lite,
// while LibTorch loads the system libprotobuf.so.32; a program linking both crashes before main()
// (in protobuf's static initialisers), and dlopen(RTLD_DEEPBIND) breaks libstdc++'s std::cerr.
// So nothing that links LibTorch links SentencePiece: this program links SentencePiece only.
//
// Encoding: a book is split into paragraphs at blank lines; the lines of a paragraph are joined
// with single spaces, encoded, and followed by the </s> id (a paragraph break).
// OUT: "APESPMI1" | i32 pieces | i32 eos | u64 books | per book: u64 n, n x i32 ids (host order).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::vector<std::string> paragraphs(const std::string &text) {
  std::vector<std::string> out;
  std::string cur;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find('\n', i);
    if (j == std::string::npos) j = text.size();
    std::string line = text.substr(i, j - i);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      if (!cur.empty()) cur += ' ';
      cur += line;
    }
    i = j + 1;
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

int train(int argc, char **argv) {
  std::string args;
  for (int i = 2; i < argc; ++i) args += (i > 2 ? " " : "") + std::string(argv[i]);
  auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) {
    std::cerr << "ape-spm: training failed: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}

// Loads the tokenizer MODEL into sp; false (after saying why on stderr) when it cannot.
bool load_tokenizer(sentencepiece::SentencePieceProcessor &sp, const char *model) {
  if (auto st = sp.Load(model); !st.ok()) {
    std::cerr << "ape-spm: cannot load tokenizer " << model << ": " << st.ToString() << "\n";
    return false;
  }
  return true;
}

int encode(int argc, char **argv) {
  if (argc < 5) {
    std::cerr << "usage: ape-spm encode MODEL OUT BOOK...\n";
    return 2;
  }
  sentencepiece::SentencePieceProcessor sp;
  if (!load_tokenizer(sp, argv[2])) return 1;
  const int eos = sp.eos_id() >= 0 ? sp.eos_id() : sp.unk_id();
  std::vector<std::string> books(argv + 4, argv + argc);
  std::vector<std::vector<int32_t>> ids(books.size());
  std::vector<std::string> errors(books.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t b; (b = next++) < books.size();) {
      std::ifstream f(books[b], std::ios::binary);
      if (!f) {
        errors[b] = "cannot read " + books[b];
        continue;
      }
      std::ostringstream text;
      text << f.rdbuf();
      std::vector<int> piece;
      for (const auto &p : paragraphs(text.str())) {
        if (auto st = sp.Encode(p, &piece); !st.ok()) {
          errors[b] = "encoding " + books[b] + ": " + st.ToString();
          break;
        }
        ids[b].insert(ids[b].end(), piece.begin(), piece.end());
        ids[b].push_back(eos);
      }
    }
  };
  const unsigned n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), books.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto &t : pool) t.join();
  for (const auto &e : errors)
    if (!e.empty()) {
      std::cerr << "ape-spm: " << e << "\n";
      return 1;
    }
  std::ofstream o(argv[3], std::ios::binary | std::ios::trunc);
  auto put = [&](const auto &v) { o.write(reinterpret_cast<const char *>(&v), sizeof v); };
  o.write("APESPMI1", 8);
  put(int32_t(sp.GetPieceSize()));
  put(int32_t(eos));
  put(uint64_t(books.size()));
  for (const auto &d : ids) {
    put(uint64_t(d.size()));
    o.write(reinterpret_cast<const char *>(d.data()), std::streamsize(d.size() * sizeof(int32_t)));
  }
  o.flush();
  if (!o) {
    std::cerr << "ape-spm: cannot write " << argv[3] << "\n";
    return 1;
  }
  return 0;
}

int decode(int argc, char **argv) {
  if (argc != 5) {
    std::cerr << "usage: ape-spm decode MODEL IDS OUT\n";
    return 2;
  }
  sentencepiece::SentencePieceProcessor sp;
  if (!load_tokenizer(sp, argv[2])) return 1;
  const int eos = sp.eos_id() >= 0 ? sp.eos_id() : sp.unk_id();
  std::ifstream in(argv[3]);
  if (!in) {
    std::cerr << "ape-spm: cannot read " << argv[3] << "\n";
    return 1;
  }
  std::string text;
  std::vector<int> run;
  auto flush = [&]() -> bool {
    std::string piece;
    if (auto st = sp.Decode(run, &piece); !st.ok()) {
      std::cerr << "ape-spm: decoding: " << st.ToString() << "\n";
      return false;
    }
    text += piece;
    run.clear();
    return true;
  };
  for (long long id; in >> id;) {
    if (id < 0 || id >= sp.GetPieceSize()) {
      std::cerr << "ape-spm: id " << id << " is outside the vocabulary [0, " << sp.GetPieceSize() << ")\n";
      return 1;
    }
    if (id == eos) {
      if (!flush()) return 1;
      text += "\n\n";
    } else {
      run.push_back(static_cast<int>(id));
    }
  }
  if (!flush()) return 1;
  std::ofstream o(argv[4], std::ios::binary | std::ios::trunc);
  o << text;
  o.flush();
  if (!o) {
    std::cerr << "ape-spm: cannot write " << argv[4] << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "train") return train(argc, argv);
  if (cmd == "encode") return encode(argc, argv);
  if (cmd == "decode") return decode(argc, argv);
  std::cerr << "usage: ape-spm train SENTENCEPIECE-FLAGS... | ape-spm encode MODEL OUT BOOK... | "
               "ape-spm decode MODEL IDS OUT\n"
               "(a helper of ape-train / ape-eval; see runtime/Tokenizer.h)\n";
  return 2;
}
