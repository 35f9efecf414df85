#include "io/progress.h"

#include <gtest/gtest.h>

namespace mlaserve {
namespace {

TEST(Progress, FormatsBytes) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(512e3), "512.00 KB");
  EXPECT_EQ(format_bytes(1234567), "1.23 MB");
  EXPECT_EQ(format_bytes(4.29e9), "4.29 GB");
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(7.4), "0:07");
  EXPECT_EQ(format_duration(62), "1:02");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-5), "0:00");
}

}  // namespace
}  // namespace mlaserve
