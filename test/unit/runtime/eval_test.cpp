// Evaluation (runtime/Eval.h): --set arguments, row labels, the multiples table and its CSV.
#include "runtime_fixtures.h"

namespace {

TEST(Eval, SetArgumentsAndRowLabels) {
  EXPECT_EQ(ape::parse_assignment("rope_factor=8"), std::make_pair(std::string("rope_factor"), 8.0));
  EXPECT_EQ(ape::parse_assignment("position_scale=0.5"), std::make_pair(std::string("position_scale"), 0.5));
  EXPECT_ERROR(ape::parse_assignment("rope_factor"), "no '='");
  EXPECT_ERROR(ape::parse_assignment("=3"), "empty name");
  EXPECT_ERROR(ape::parse_assignment("x=eight"), "'eight' is not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=8x"), "not a finite number");
  EXPECT_ERROR(ape::parse_assignment("x=inf"), "not a finite number");
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
}

}  // namespace
