"""The mutation fuzzer (fuzz_package.py) in the suite: >= 10,000 cases, only typed rejections."""

import fuzz_package


def test_mutation_fuzzer_10k_cases_only_typed_errors():
    report = fuzz_package.run(10_000, seed=1)
    assert report.cases == 10_000
    assert report.findings == []
    assert report.slowest_s < fuzz_package.CASE_TIME_CAP_S
    assert sum(report.rejected.values()) + report.accepted + report.unchanged == report.cases
