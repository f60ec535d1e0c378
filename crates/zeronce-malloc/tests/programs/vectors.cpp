// C++: new/delete and std containers of large sizes reach malloc through libstdc++.
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

int main() {
    double total = 0;
    for (int r = 0; r < 6; r++) {
        std::vector<double> v((size_t)(3 + r) << 18, 1.5);  // 6 to 16 MiB
        v.resize(v.size() * 3, 0.5);                           // grows past the first block
        total += std::accumulate(v.begin(), v.end(), 0.0);
    }
    auto big = std::make_unique<long[]>(4 << 20);  // 32 MiB, value-initialised (zero)
    long s = 0;
    for (size_t i = 0; i < (4u << 20); i += 512) s += big[i];
    std::map<int, std::string> m;
    for (int i = 0; i < 50000; i++) m[i * 7 % 50021] = std::to_string(i);
    std::vector<std::thread> ts;
    std::vector<double> sums(4);
    for (int t = 0; t < 4; t++)
        ts.emplace_back([t, &sums] {
            for (int r = 0; r < 20; r++) {
                std::vector<float> w((size_t)(1 + t + r % 3) << 20, float(t));
                sums[t] += w[w.size() / 2];
            }
        });
    for (auto &t : ts) t.join();
    std::printf("total %.1f zero-sum %ld map %zu %s threads %.1f %.1f %.1f %.1f\n", total, s,
                m.size(), m[7].c_str(), sums[0], sums[1], sums[2], sums[3]);
    return 0;
}
