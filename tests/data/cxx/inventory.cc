// A small C++ file with what C++ packages are made of: templates, inline member
// functions and std containers, all emitted as linkonce_odr in every module that uses them.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Item {
  std::string name;
  int count = 0;
  double price = 0;
  double value() const { return count * price; }
};

class Shelf {
 public:
  virtual ~Shelf() = default;
  virtual double total() const = 0;
};

template <typename T>
class Bin final : public Shelf {
 public:
  void add(T item) { items_.push_back(std::move(item)); }
  double total() const override {
    double sum = 0;
    for (const auto &i : items_) sum += i.value();
    return sum;
  }
  const std::vector<T> &items() const { return items_; }

 private:
  std::vector<T> items_;
};

}  // namespace

std::map<std::string, int> tally(const std::vector<std::string> &names) {
  std::map<std::string, int> out;
  for (const auto &n : names) ++out[n];
  return out;
}

double inventory(const std::vector<std::string> &names, const std::vector<double> &prices) {
  auto bin = std::make_unique<Bin<Item>>();
  for (const auto &[name, count] : tally(names)) {
    auto it = std::find(names.begin(), names.end(), name);
    double price = prices.at(static_cast<size_t>(it - names.begin()) % prices.size());
    bin->add(Item{name, count, price});
  }
  std::vector<Item> sorted = bin->items();
  std::sort(sorted.begin(), sorted.end(),
            [](const Item &a, const Item &b) { return a.value() < b.value(); });
  std::unique_ptr<Shelf> shelf = std::move(bin);
  return shelf->total() + (sorted.empty() ? 0 : sorted.back().value());
}
