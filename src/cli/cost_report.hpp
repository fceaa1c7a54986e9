// What `fedwan costs` prints: the bill, and what it rests on (whose
// signatures, which checks bounded the figures, what was refused or
// disagreed), as text tables or as one JSON object.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costs/cost_bill.hpp"
#include "costs/cost_checks.hpp"
#include "costs/cost_ledger.hpp"

namespace fedwan::cli {

// Everything `fedwan costs` learnt about the records besides the bill.
// `ledger` and `checked` are the caller's and must outlive the findings.
struct CostFindings {
  std::vector<std::string> files;
  const costs::CostLedger* ledger = nullptr;
  const costs::CheckedCosts* checked = nullptr;
  std::string ca, crl, topology;

  std::vector<costs::CostRefusal> refused() const {
    std::vector<costs::CostRefusal> all = ledger->refusals();
    all.insert(all.end(), checked->refused.begin(), checked->refused.end());
    return all;
  }
  std::vector<const costs::LinkReconciliation*> mismatches() const {
    std::vector<const costs::LinkReconciliation*> out;
    for (const costs::LinkReconciliation& l : checked->links) {
      if (l.mismatch) out.push_back(&l);
    }
    return out;
  }
  bool clean() const {
    return refused().empty() && mismatches().empty() && ledger->conflicts().empty();
  }
};

nlohmann::ordered_json bill_json(const costs::CostBill& b, const std::string& window,
                                 const CostFindings& f);

// The findings in words, then the bill's table and one per window.
void print_bill(std::ostream& out, const costs::CostBill& bill, const CostFindings& f);

}  // namespace fedwan::cli
