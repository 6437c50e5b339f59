"""A site's warnings: every source asked for each report, a failing source named rather than failing it."""

from __future__ import annotations

from msgbusd.reports.site_warnings import SiteWarnings


def test_each_source_is_asked_afresh_in_the_order_added() -> None:
    warnings = SiteWarnings()
    disk: list[str] = []
    warnings.add(lambda: disk)
    warnings.add(lambda: ["a clock is off"])
    assert warnings.current() == ["a clock is off"]
    disk.append("the disk is full")
    assert warnings.current() == ["the disk is full", "a clock is off"]


def test_a_source_that_fails_is_named_and_the_others_still_report() -> None:
    def broken() -> list[str]:
        raise ValueError("no figure")

    warnings = SiteWarnings()
    warnings.add(broken)
    warnings.add(lambda: ["a clock is off"])
    assert warnings.current() == ["a warning could not be worked out: no figure", "a clock is off"]
