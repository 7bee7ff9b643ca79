// Round trips through the C++ wrapper (mooncake_rs.hpp), embedded master. Compiled with
// -fno-exceptions: the wrapper must not need them.
#include "support.hpp"

#include <cstring>
#include <string>
#include <vector>

using mooncake_rs::BufferHandle;
using mooncake_rs::ReplicateConfig;
using test::EmbeddedTest;
using test::pattern;

namespace {

class WrapperTest : public EmbeddedTest {
protected:
    /** Reads `k` with get_into into a buffer of `capacity` and returns the bytes read. */
    std::vector<char> read(const std::string &k, size_t capacity = 1 << 20) {
        std::vector<char> out(capacity);
        int64_t n = client->get_into(k, out.data(), out.size());
        EXPECT_GE(n, 0) << k << ": " << test::last_error();
        out.resize(n < 0 ? 0 : static_cast<size_t>(n));
        return out;
    }
};

TEST_F(WrapperTest, LifecycleAndHostname) {
    EXPECT_EQ(client->health_check(), 0);
    EXPECT_FALSE(client->get_hostname().empty());
    EXPECT_EQ(client->tearDownAll(), 0);
    EXPECT_EQ(client->tearDownAll(), 0);  // idempotent
    EXPECT_EQ(client->health_check(), 1);
    EXPECT_EQ(client->put(key("after"), std::string("x")), test::kInvalidParams);
}

TEST_F(WrapperTest, PutAndGetInto) {
    std::vector<char> value = pattern(100000, 1);
    ASSERT_EQ(client->put(key("v"), value), 0) << test::last_error();
    EXPECT_EQ(client->isExist(key("v")), 1);
    EXPECT_EQ(client->getSize(key("v")), static_cast<int64_t>(value.size()));
    EXPECT_EQ(read(key("v")), value);
    ASSERT_EQ(client->put(key("s"), std::string("short text")), 0);
    EXPECT_EQ(read(key("s")), (std::vector<char>{'s', 'h', 'o', 'r', 't', ' ', 't', 'e', 'x', 't'}));
}

TEST_F(WrapperTest, PutFromAndBatchesWithRegisteredBuffers) {
    std::vector<char> a = pattern(4096, 2), b = pattern(70000, 3);
    ASSERT_EQ(client->register_buffer(a.data(), a.size()), 0);
    ASSERT_EQ(client->register_buffer(b.data(), b.size()), 0);
    EXPECT_EQ(client->put_from(key("a"), a.data(), a.size()), 0);
    std::vector<int> put = client->batch_put_from({key("b1"), key("b2")}, {a.data(), b.data()},
                                                  {a.size(), b.size()});
    EXPECT_EQ(put, (std::vector<int>{0, 0}));

    std::vector<char> out1(a.size()), out2(b.size() + 10), out3(16);
    std::vector<int64_t> got = client->batch_get_into({key("b1"), key("b2"), key("none")},
                                                      {out1.data(), out2.data(), out3.data()},
                                                      {out1.size(), out2.size(), out3.size()});
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], static_cast<int64_t>(a.size()));
    EXPECT_EQ(got[1], static_cast<int64_t>(b.size()));
    EXPECT_EQ(got[2], test::kObjectNotFound);
    EXPECT_EQ(0, std::memcmp(out1.data(), a.data(), a.size()));
    EXPECT_EQ(0, std::memcmp(out2.data(), b.data(), b.size()));
    EXPECT_EQ(read(key("a")), a);
    EXPECT_EQ(client->unregister_buffer(a.data()), 0);
    EXPECT_EQ(client->unregister_buffer(b.data()), 0);
}

TEST_F(WrapperTest, MultiBuffersScatterAndGather) {
    std::vector<char> p1 = pattern(1000, 4), p2 = pattern(3000, 5), p3 = pattern(24, 6);
    std::vector<int> put = client->batch_put_from_multi_buffers(
        {key("m")}, {{p1.data(), p2.data(), p3.data()}}, {{p1.size(), p2.size(), p3.size()}});
    EXPECT_EQ(put, std::vector<int>{0});
    std::vector<char> whole = p1;
    whole.insert(whole.end(), p2.begin(), p2.end());
    whole.insert(whole.end(), p3.begin(), p3.end());
    EXPECT_EQ(read(key("m")), whole);

    std::vector<char> x(2000), y(2024);
    std::vector<int> got = client->batch_get_into_multi_buffers({key("m")}, {{x.data(), y.data()}},
                                                                {{x.size(), y.size()}});
    EXPECT_EQ(got, std::vector<int>{4024});
    EXPECT_EQ(0, std::memcmp(x.data(), whole.data(), x.size()));
    EXPECT_EQ(0, std::memcmp(y.data(), whole.data() + x.size(), y.size()));
}

TEST_F(WrapperTest, PutPartsAndPutBatch) {
    std::vector<std::string> parts{"head-", "body-", "tail"};
    EXPECT_EQ(client->put_parts(key("parts"), parts), 0);
    std::vector<char> expected{'h', 'e', 'a', 'd', '-', 'b', 'o', 'd', 'y', '-', 't', 'a', 'i', 'l'};
    EXPECT_EQ(read(key("parts")), expected);

    std::vector<std::vector<char>> values{pattern(10, 7), pattern(20000, 8)};
    EXPECT_EQ(client->put_batch({key("pb0"), key("pb1")}, values), 0);
    EXPECT_EQ(read(key("pb0")), values[0]);
    EXPECT_EQ(read(key("pb1")), values[1]);
}

TEST_F(WrapperTest, UpsertFamilyOverwrites) {
    ASSERT_EQ(client->put(key("u"), std::string("old value")), 0);
    EXPECT_EQ(client->upsert(key("u"), std::string("new value")), 0);  // same size: in place
    EXPECT_EQ(read(key("u")), (std::vector<char>{'n', 'e', 'w', ' ', 'v', 'a', 'l', 'u', 'e'}));
    EXPECT_EQ(client->upsert(key("u"), std::string("longer new value")), 0);  // reallocated
    EXPECT_EQ(client->getSize(key("u")), 16);

    std::vector<char> buf = pattern(512, 9);
    EXPECT_EQ(client->upsert_from(key("uf"), buf.data(), buf.size()), 0);
    EXPECT_EQ(read(key("uf")), buf);
    EXPECT_EQ(client->upsert_parts(key("up"), std::vector<std::string>{"a", "b"}), 0);
    EXPECT_EQ(read(key("up")), (std::vector<char>{'a', 'b'}));
    EXPECT_EQ(client->upsert_batch({key("ub")}, std::vector<std::string>{"batch"}), 0);
    EXPECT_EQ(read(key("ub")).size(), 5u);

    std::vector<char> c = pattern(64, 10), d = pattern(32, 11);
    EXPECT_EQ(client->batch_upsert_from({key("uf")}, {c.data()}, {c.size()}), std::vector<int>{0});
    EXPECT_EQ(read(key("uf")), c);
    EXPECT_EQ(client->batch_upsert_from_multi_buffers({key("uf")}, {{c.data(), d.data()}},
                                                      {{c.size(), d.size()}}),
              std::vector<int>{0});
    EXPECT_EQ(read(key("uf")).size(), 96u);
}

TEST_F(WrapperTest, GetBufferIsRaiiAndMovable) {
    std::vector<char> value = pattern(50000, 12);
    ASSERT_EQ(client->put(key("g"), value), 0);
    std::shared_ptr<BufferHandle> handle = client->get_buffer(key("g"));
    ASSERT_NE(handle, nullptr) << test::last_error();
    ASSERT_EQ(handle->size(), value.size());
    EXPECT_EQ(0, std::memcmp(handle->ptr(), value.data(), value.size()));

    BufferHandle moved(std::move(*handle));
    EXPECT_EQ(moved.size(), value.size());
    EXPECT_EQ(handle->ptr(), nullptr);  // moved-from is empty
    EXPECT_EQ(handle->size(), 0u);
    EXPECT_EQ(client->get_buffer(key("missing")), nullptr);

    std::vector<std::shared_ptr<BufferHandle>> batch =
        client->batch_get_buffer({key("g"), key("missing"), key("g")});
    ASSERT_EQ(batch.size(), 3u);
    ASSERT_NE(batch[0], nullptr);
    EXPECT_EQ(batch[1], nullptr);
    ASSERT_NE(batch[2], nullptr);
    EXPECT_EQ(0, std::memcmp(batch[2]->ptr(), value.data(), value.size()));
}

TEST_F(WrapperTest, GetIntoRangesUsesRegisteredCapacity) {
    std::vector<char> value = pattern(8192, 13);
    ASSERT_EQ(client->put(key("r"), value), 0);
    std::vector<char> dst(4096, 0);
    ASSERT_EQ(client->register_buffer(dst.data(), dst.size()), 0);
    auto result = client->get_into_ranges({dst.data()}, {{key("r")}}, {{{0, 200}}}, {{{8000, 0}}},
                                          {{{192, 50}}});
    ASSERT_EQ(result.size(), 1u);
    ASSERT_EQ(result[0].size(), 1u);
    EXPECT_EQ(result[0][0], (std::vector<int64_t>{192, 50}));
    EXPECT_EQ(0, std::memcmp(dst.data(), value.data() + 8000, 192));
    EXPECT_EQ(0, std::memcmp(dst.data() + 200, value.data(), 50));
    EXPECT_EQ(dst[199], 0);  // untouched between the fragments
    EXPECT_EQ(client->unregister_buffer(dst.data()), 0);

    std::vector<char> loose(64);  // unregistered: capacity unknown, -600 as in Mooncake
    auto refused = client->get_into_ranges({loose.data()}, {{key("r")}}, {{{0}}}, {{{0}}}, {{{8}}});
    EXPECT_EQ(refused[0][0], std::vector<int64_t>{test::kInvalidParams});
}

TEST_F(WrapperTest, PutAndGetSessions) {
    const size_t page = 4096;
    std::vector<char> l0 = pattern(page, 14), l1 = pattern(page, 15);
    EXPECT_EQ(client->batch_put_session_start({key("s")}, {2 * page}), std::vector<int>{0});
    EXPECT_EQ(client->batch_put_from_multi_buffer_ranges({key("s")}, {{l1.data()}}, {{page}},
                                                         {{page}}),
              std::vector<int>{static_cast<int>(page)});
    EXPECT_EQ(client->batch_put_from_multi_buffer_ranges({key("s")}, {{l0.data()}}, {{page}}, {{0}}),
              std::vector<int>{static_cast<int>(page)});
    EXPECT_EQ(client->batch_put_session_end({key("s")}), std::vector<int>{0});

    EXPECT_EQ(client->batch_get_session_start({key("s")}), std::vector<int>{0});
    std::vector<char> a(page), b(page);
    EXPECT_EQ(client->batch_get_into_multi_buffer_ranges({key("s")}, {{b.data(), a.data()}},
                                                         {{page, page}}, {{page, 0}}),
              std::vector<int>{static_cast<int>(2 * page)});
    EXPECT_EQ(a, l0);
    EXPECT_EQ(b, l1);
    EXPECT_EQ(client->batch_get_session_end({key("s")}), 0);
    EXPECT_EQ(client->batch_get_session_end({key("s")}), 0);  // idempotent

    EXPECT_EQ(client->batch_put_session_start({key("revoked")}, {page}), std::vector<int>{0});
    EXPECT_EQ(client->batch_put_session_revoke({key("revoked")}), std::vector<int>{0});
    EXPECT_EQ(client->isExist(key("revoked")), 0);
}

TEST_F(WrapperTest, ExistenceAndRemoval) {
    for (int i = 0; i < 3; ++i) ASSERT_EQ(client->put(key("x" + std::to_string(i)), std::string("v")), 0);
    EXPECT_EQ(client->batchIsExist({key("x0"), key("nope"), key("x2")}), (std::vector<int>{1, 0, 1}));
    EXPECT_EQ(client->batchRemove({key("x0"), key("x0"), key("nope")}, true),
              (std::vector<int>{0, test::kObjectNotFound, test::kObjectNotFound}));
    EXPECT_EQ(client->removeByRegex("^" + prefix + "x[12]$", true), 2);
    EXPECT_EQ(client->put(key("y"), std::string("v")), 0);
    EXPECT_EQ(client->removeAll(true), 1);
    EXPECT_EQ(client->isExist(key("y")), 0);
}

TEST_F(WrapperTest, ReplicateConfigIsHonoured) {
    ReplicateConfig config;
    config.replica_num = 2;  // best effort: one segment, one replica, still success
    config.with_hard_pin = true;
    config.with_soft_pin = true;
    config.preferred_segments = {client->get_hostname()};
    EXPECT_EQ(client->put(key("pinned"), std::string("kept"), config), 0) << test::last_error();
    EXPECT_EQ(read(key("pinned")), (std::vector<char>{'k', 'e', 'p', 't'}));
    ReplicateConfig deprecated_single;
    deprecated_single.preferred_segment = client->get_hostname();
    EXPECT_EQ(client->put(key("single"), std::string("one"), deprecated_single), 0);
}

TEST(WrapperFactory, CreateReturnsUsableClient) {
    std::shared_ptr<mooncake_rs::RealClient> client = mooncake_rs::RealClient::create();
    ASSERT_NE(client, nullptr);
    EXPECT_NE(client->handle(), nullptr);
    EXPECT_EQ(client->health_check(), 1);
    EXPECT_EQ(client->initAll("tcp", "", 16 * test::kMiB), 0) << test::last_error();
    EXPECT_EQ(client->initAll("tcp", "", 16 * test::kMiB), test::kInvalidParams);
    EXPECT_STREQ(mooncake_rs::RealClient::strerror(test::kObjectNotFound), "OBJECT_NOT_FOUND");
}

}  // namespace
