#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chat/model_chat_settings.h"
#include "core/error.h"

namespace mlaserve::chat {
namespace {

namespace fs = std::filesystem;

class ModelChatSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("mlaserve_chat_settings_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path dir(const std::string& name) {
    fs::create_directories(root_ / name);
    return root_ / name;
  }
  static void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }
  fs::path root_;
};

TEST_F(ModelChatSettingsTest, DetectsFromArchitectureNameAndDirectory) {
  fs::path v32 = dir("some-model");
  write(v32 / "config.json", R"({"architectures": ["DeepseekV32ForCausalLM"]})");
  EXPECT_EQ(detect_chat_template(v32), ChatTemplateKind::V32);

  fs::path named = dir("local");
  write(named / "config.json", R"({"architectures": ["DeepseekV3ForCausalLM"], "_name_or_path": "deepseek-ai/DeepSeek-R1"})");
  EXPECT_EQ(detect_chat_template(named), ChatTemplateKind::R1);

  fs::path by_dir = dir("DeepSeek-V3.1-Terminus");
  EXPECT_EQ(detect_chat_template(by_dir), ChatTemplateKind::V31);  // no config.json: the name decides
  EXPECT_EQ(detect_chat_template(by_dir / ""), ChatTemplateKind::V31);

  fs::path bad = dir("broken");
  write(bad / "config.json", "{not json");
  EXPECT_THROW(detect_chat_template(bad), Error);
}

TEST_F(ModelChatSettingsTest, ReadsSpecialTokens) {
  fs::path d = dir("tok");
  EXPECT_EQ(load_chat_tokens(d).bos, "<｜begin▁of▁sentence｜>");
  write(d / "tokenizer_config.json",
        R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})");
  ChatTokens t = load_chat_tokens(d);
  EXPECT_EQ(t.bos, "<s>");
  EXPECT_EQ(t.eos, "</s>");
  write(d / "tokenizer_config.json", R"({"bos_token": 5})");
  EXPECT_THROW(load_chat_tokens(d), Error);
}

}  // namespace
}  // namespace mlaserve::chat
