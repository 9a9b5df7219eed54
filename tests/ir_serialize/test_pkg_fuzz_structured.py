"""The structured fuzzer (fuzz_structured.py) in the suite: 10,000 seeded cases of hostile graphs in
correctly signed packages; every one verifies or gets a PackageError raised on purpose."""

import fuzz_structured


def test_structured_fuzzer_10k_cases_only_typed_errors():
    # act
    report = fuzz_structured.run(10_000, seed=7)
    # assert
    assert report.cases == 10_000
    assert report.findings == {}, report.summary(examples=5)["findings"]
    assert report.netted == {}, report.summary(examples=5)["netted"]
    assert report.slowest_s < fuzz_structured.CASE_TIME_CAP_S
    assert report.accepted + sum(report.rejected.values()) + sum(report.writer_rejected.values()) == report.cases
    assert report.accepted > report.cases // 10  # some mutants still verify: the fuzzer gets past the first checks
