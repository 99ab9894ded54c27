// Checkpoints (runtime/Checkpoint.h): round trips, corrupt, truncated and foreign files, loading
// into another encoding, interrupted writes.
#include "runtime_fixtures.h"

namespace {

TEST(Checkpoint, RoundTripRestoresEveryTensor) {
  at::manual_seed(10);
  ape::LanguageModel a(testk::bias_shared, tiny_config("test_bias_shared"));
  const std::string path = tmp_path("model.ckpt");
  ape::save_checkpoint(path, a, {{"train", {{"seq_len", 8}}}});
  at::manual_seed(11);
  ape::LanguageModel b(testk::bias_shared, tiny_config("test_bias_shared"));
  ape::Checkpoint c = ape::read_checkpoint(path);
  EXPECT_EQ(c.encoding, "test_bias_shared");
  EXPECT_EQ(c.config["train"]["seq_len"], 8);
  EXPECT_EQ(c.config["model"]["d_model"], 16);
  ape::load_state(b, c, path);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto &kv : pa) EXPECT_TRUE(kv.value().equal(pb[kv.key()])) << kv.key();
  // Shared tensors are still shared after loading (copied in place).
  EXPECT_EQ(b->blocks[0]->attn->kernel_params()[0].data_ptr(), b->named_parameters()["shared_w"].data_ptr());
  at::Tensor x = at::randint(32, {1, 6}, at::kLong);
  EXPECT_TRUE(a->forward(x).equal(b->forward(x)));
}

TEST(Checkpoint, CorruptTruncatedOrForeignFilesGiveClearErrors) {
  ape::LanguageModel a(testk::bias_entry, tiny_config("test_bias"));
  const std::string path = tmp_path("bad.ckpt");
  ape::save_checkpoint(path, a, nlohmann::json::object());
  const auto size = fs::file_size(path);
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    bytes = s.str();
  }
  auto write = [&](const std::string &b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };

  std::string flipped = bytes;
  flipped[size / 2] ^= 0x40;
  write(flipped);
  EXPECT_ERROR(ape::read_checkpoint(path), "checksum mismatch");
  for (size_t cut : {size - 1, size / 2, size_t(30), size_t(9)}) {
    write(bytes.substr(0, cut));
    EXPECT_ERROR(ape::read_checkpoint(path), "truncated");
  }
  write("APECKPT0 something else entirely");
  EXPECT_ERROR(ape::read_checkpoint(path), "not an APE checkpoint");
  std::string v3 = bytes;
  v3[8] = 3;
  write(v3);
  EXPECT_ERROR(ape::read_checkpoint(path), "format version 3, this build reads version 2");
  v3[8] = 1;
  write(v3);
  EXPECT_ERROR(ape::read_checkpoint(path), "format version 1 (written before resumable checkpoints)");
  EXPECT_ERROR(ape::read_checkpoint(tmp_path("missing.ckpt")), "cannot open");

  write(bytes);
  ape::LanguageModel other(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(ape::load_state(other, ape::read_checkpoint(path), path),
               "it holds encoding 'test_bias', but the model is 'test_nope'");
  ape::ModelConfig wide = tiny_config("test_bias");
  wide.d_model = 32;
  ape::LanguageModel w(testk::bias_entry, wide);
  EXPECT_ERROR(ape::load_state(w, ape::read_checkpoint(path), path), "has shape");
  // Loading through the registry names the unknown encoding.
  EXPECT_ERROR(ape::load_model(path), "unknown encoding 'test_bias'");
}

TEST(Checkpoint, LoadsIntoAnotherEncodingWhenTheTrainableParametersMatch) {
  at::manual_seed(40);
  ape::LanguageModel a(testk::nope, tiny_config("test_nope"));
  const std::string path = tmp_path("cross.ckpt");
  ape::save_checkpoint(path, a, {{"train", {{"seq_len", 8}}}});
  const ape::Checkpoint ckpt = ape::read_checkpoint(path);
  // test_nope_fixed: the same trainable parameters plus a fixed param the checkpoint lacks.
  ape::LanguageModel b(testk::nope_fixed, tiny_config("test_nope_fixed"));
  auto kept = ape::load_state_across(b, ckpt, path, &testk::nope);
  EXPECT_EQ(kept, std::vector<std::string>({"block0.attn.knob", "block1.attn.knob"}));
  EXPECT_EQ(b->blocks[0]->attn->stored_param(0).item<double>(), 3.0);  // the new encoding's init
  at::Tensor w = at::randint(32, {2, 9}, at::kLong);
  {
    at::NoGradGuard ng;
    EXPECT_EQ(a->loss(w).item<double>(), b->loss(w).item<double>());
  }
  // The same encoding after it gained a fixed param: the old checkpoint still loads, the new buffer
  // keeps its initial value.
  static const ape::KernelEntry grown = testk::entry<testk::Kind::Nope>(
      "test_nope", R"({"encoding": "test_nope", "params": [{"name": "knob", "shape": [1],
                      "init": {"kind": "constant", "value": 3.0}}]})");
  ape::LanguageModel g(grown, tiny_config("test_nope"));
  ape::load_state(g, ckpt, path);
  EXPECT_EQ(g->blocks[1]->attn->stored_param(0).item<double>(), 3.0);
  EXPECT_TRUE(g->wte->weight.equal(a->wte->weight));
  // Mismatches name the first parameter at fault, both ways.
  ape::LanguageModel bias(testk::bias_entry, tiny_config("test_bias"));
  EXPECT_ERROR(ape::load_state_across(bias, ckpt, path, &testk::nope),
               "trainable parameter 'block0.attn.w' of 'test_bias' is not in the checkpoint");
  ape::save_checkpoint(path, bias, nlohmann::json::object());
  ape::LanguageModel c(testk::nope, tiny_config("test_nope"));
  EXPECT_ERROR(ape::load_state_across(c, ape::read_checkpoint(path), path, &testk::bias_entry),
               "the checkpoint's trainable parameter 'block0.attn.w' has no place in 'test_nope'");
  ape::LanguageModel learned(testk::learned, tiny_config("test_learned"));
  EXPECT_ERROR(ape::load_state_across(learned, ckpt, path, &testk::nope),
               "trainable parameter 'wpe' of 'test_learned' is not in the checkpoint");
  // Through the registry, an unregistered source encoding is named.
  EXPECT_ERROR(ape::load_state_across(b, ckpt, path), "unknown encoding 'test_nope'");
}

TEST(Checkpoint, AnInterruptedWriteLeavesThePreviousFile) {
  ape::LanguageModel a(testk::nope, tiny_config("test_nope"));
  const std::string path = tmp_path("atomic.ckpt");
  ape::save_checkpoint(path, a, nlohmann::json::object());
  // Simulate a crash mid-write: a partial temporary file next to the good one.
  std::ofstream(path + ".tmp.999999", std::ios::binary) << "APECKPT1 partial";
  EXPECT_NO_THROW(ape::read_checkpoint(path));
  // Saving again replaces the file in one rename.
  ape::save_checkpoint(path, a, {{"again", true}});
  EXPECT_EQ(ape::read_checkpoint(path).config["again"], true);
}

}  // namespace
