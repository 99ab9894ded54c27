// Evaluation (runtime/Eval.h): --set arguments, row labels, the multiples table and its CSV.
#include "runtime_fixtures.h"
#include <limits>

namespace {

TEST(Eval, SetArgumentsAndRowLabels) {
  EXPECT_EQ(ape::parse_assignment("rope_factor=8"), std::make_pair(std::string("rope_factor"), 8.0));
  EXPECT_EQ(ape::parse_assignment("position_scale=0.5"), std::make_pair(std::string("position_scale"), 0.5));
  EXPECT_ERROR(ape::parse_assignment("rope_factor"), "no '='");
  EXPECT_ERROR(ape::parse_assignment("=3"), "empty name");
  EXPECT_ERROR(ape::parse_assignment("x=eight"), "'eight' is not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=8x"), "not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=inf"), "not a finite number");
  // Decimal, as the options (std::stod alone read hex floats and leading spaces).
  EXPECT_ERROR(ape::parse_assignment("rope_factor=0x10"), "'0x10' is not a finite number");
  EXPECT_ERROR(ape::parse_assignment("rope_factor= 4"), "' 4' is not a finite number");
  EXPECT_EQ(ape::parse_assignment("rope_factor=.5e1"), std::make_pair(std::string("rope_factor"), 5.0));
  EXPECT_EQ(ape::parse_assignment("rope_factor=4."), std::make_pair(std::string("rope_factor"), 4.0));
  EXPECT_EQ(ape::eval_label("rope", "rope", {}), "rope");
  EXPECT_EQ(ape::eval_label("rope", "", {}), "rope");
  EXPECT_EQ(ape::eval_label("rope", "rope_yarn", {{"rope_factor", 8}}), "rope->rope_yarn[rope_factor=8]");
  EXPECT_EQ(ape::eval_label("exqpe", "exqpe", {{"position_scale", 0.5}, {"x", 1e-3}}),
            "exqpe[position_scale=0.5;x=0.001]");
}

TEST(Eval, MultiplesTableAndCsv) {
  EXPECT_EQ(ape::parse_multiples("8, 1,2,4,2"), std::vector<int64_t>({1, 2, 4, 8}));
  EXPECT_ERROR(ape::parse_multiples("1,x"), "--eval-multiples: expected whole numbers in [1, 1024]");
  EXPECT_ERROR(ape::parse_multiples("0"), "--eval-multiples: expected whole numbers in [1, 1024]");
  EXPECT_ERROR(ape::parse_multiples("1,,2"), "--eval-multiples: expected whole numbers in [1, 1024]");
  EXPECT_ERROR(ape::parse_multiples("1,2,"), "an empty item at its end");
  EXPECT_ERROR(ape::parse_multiples("2048"), "--eval-multiples: expected whole numbers in [1, 1024]");
  std::vector<ape::EvalRow> rows;
  for (const char *enc : {"rope", "cable"})
    for (int64_t m : {1, 2})
      rows.push_back({enc, 128, 128 * m, m, 4.0 + m, std::exp(4.0 + m), 1000, "", {3.9 + m, 4.1 + m}});
  std::ostringstream out;
  ape::print_table(out, rows, "title");
  const std::string t = out.str();
  EXPECT_NE(t.find("title\n"), std::string::npos);
  EXPECT_NE(t.find("1x (128)"), std::string::npos) << t;
  EXPECT_NE(t.find("2x (256)"), std::string::npos) << t;
  EXPECT_NE(t.find("5.000 / 148.41"), std::string::npos) << t;
  EXPECT_LT(t.find("rope"), t.find("cable"));
  const std::string csv = tmp_path("r.csv");
  ape::write_csv(csv, rows);
  std::ifstream f(csv);
  std::string header, first;
  std::getline(f, header);
  std::getline(f, first);
  EXPECT_EQ(header, "encoding,train_len,eval_len,multiple,loss,ppl,tokens,note,segment_losses");
  EXPECT_EQ(first, "rope,128,128,1,5.000000,148.413159,1000,,4.900000;5.100000") << first;
  // A non-finite cell: no loss, no segments (the NaN among them stopped the study's reader).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ape::write_csv(csv, {{"rope", 128, 2048, 16, nan, nan, 1000, "non-finite loss: the model computes NaN", {4.6, nan}}});
  std::ifstream g(csv);
  std::getline(g, header);
  std::getline(g, first);
  EXPECT_EQ(first, "rope,128,2048,16,,,1000,non-finite loss: the model computes NaN,") << first;
}

// results.csv keeps the rows of the encodings a run did not train (keep_other_encodings): also
// from a file saved with CRLF line ends, a byte-order mark and no last newline; one with another header is set aside beside it, said so,
// never dropped (a first version dropped its rows without a word).
TEST(Eval, CsvMergeKeepsOtherRowsOrSetsTheFileAside) {
  namespace fs = std::filesystem;
  const std::string dir = tmp_path("csvmerge");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string csv = dir + "/results.csv";
  auto read = [](const std::string &p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::vector<ape::EvalRow> rope = {{"rope", 128, 128, 1, 5.0, std::exp(5.0), 1000, "", {}}};
  const std::vector<ape::EvalRow> alibi = {{"alibi", 128, 128, 1, 4.0, std::exp(4.0), 1000, "", {}}};
  ape::write_csv(csv, rope);
  std::string text = read(csv);
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  crlf.resize(crlf.size() - 2);  // and no line end after the last row, a byte-order mark first
  std::ofstream(csv, std::ios::binary | std::ios::trunc) << "\xEF\xBB\xBF" << crlf;
  ape::write_csv(csv, alibi, /*keep_other_encodings=*/true);
  text = read(csv);
  EXPECT_NE(text.find("\nrope,128,128,1,5.000000"), std::string::npos) << text;
  EXPECT_NE(text.find("\nalibi,128,128,1,4.000000"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;

  const std::string old = "encoding,train_len,eval_len,multiple,loss,ppl\nrope,128,128,1,5.0,148.4\n";
  std::ofstream(csv, std::ios::binary | std::ios::trunc) << old;
  ape::write_csv(csv, alibi, /*keep_other_encodings=*/true);
  EXPECT_EQ(read(dir + "/results.unmerged.csv"), old);
  text = read(csv);
  EXPECT_NE(text.find("\nalibi,"), std::string::npos) << text;
  std::ofstream(csv, std::ios::binary | std::ios::trunc) << old;
  ape::write_csv(csv, alibi, /*keep_other_encodings=*/true);
  EXPECT_EQ(read(dir + "/results.unmerged-1.csv"), old);  // the first one kept
  // A quote never closed (an edit by hand): the rows from there on are no records, and had been
  // dropped without a word; the file is set aside as another header's is.
  ape::write_csv(csv, rope);
  const std::string broken = read(csv) + "xpos,32,32,1,\"6.9,bad\n";
  std::ofstream(csv, std::ios::binary | std::ios::trunc) << broken;
  ape::write_csv(csv, alibi, /*keep_other_encodings=*/true);
  EXPECT_EQ(read(dir + "/results.unmerged-2.csv"), broken);
  EXPECT_NE(read(csv).find("\nalibi,"), std::string::npos);
}

}  // namespace
