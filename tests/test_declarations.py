"""What the plug-ins declare beside their rows names only what exists: every cause link and every expectation
names a check some stage declares, and reasons that check declares. A typo in a declaration would otherwise
leave a cause never found, or an expectation never judged, without any error."""

from __future__ import annotations

from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import ReasonCatalog
from cluster_accept.tasks.stages import STAGES, declared_expectations, declared_links, reason_catalog


def link_problems(link: Link, catalog: ReasonCatalog) -> list[str]:
    said = f"link {link.cause_check} -> {sorted(link.symptoms)} ({link.stage})"
    problems = [f"{said}: no check {check!r}" for check in (link.cause_check, *link.symptoms) if check not in
                catalog.by_check]  # fmt: skip
    problems += [
        f"{said}: {link.cause_check} declares no reason {code!r}"
        for code in link.reasons
        if not catalog.declared(link.cause_check, code)
    ]
    problems += [
        f"{said}: no symptom check declares {code!r}"
        for code in link.symptom_reasons
        if not any(catalog.declared(check, code) for check in link.symptoms)
    ]
    if link.stage not in {stage.name for stage in STAGES}:
        problems.append(f"{said}: no stage {link.stage!r}")
    return problems


def expectation_problems(expectation: Expectation, catalog: ReasonCatalog) -> list[str]:
    said = f"expectation {expectation.name!r}"
    checks = (expectation.check, *expectation.settled_by)
    problems = [f"{said}: no check {check!r}" for check in checks if check not in catalog.by_check]
    problems += [
        f"{said}: no settling check declares {code!r}"
        for code in expectation.settling_reasons
        if not any(catalog.declared(check, code) for check in expectation.settled_by)
    ]
    if expectation.stage not in {stage.name for stage in STAGES}:
        problems.append(f"{said}: no stage {expectation.stage!r}")
    return problems


def test_every_declared_link_and_expectation_names_a_declared_check_and_reason() -> None:
    catalog = reason_catalog()
    links, expectations = declared_links(), declared_expectations()
    assert len(links) > 20 and len(expectations) > 40, "the stages' declarations were not gathered"
    problems = [p for link in links for p in link_problems(link, catalog)]
    problems += [p for e in expectations for p in expectation_problems(e, catalog)]
    assert not problems, "\n".join(problems)


def test_a_declaration_naming_what_does_not_exist_is_found() -> None:
    """The checks above can fail: a misspelt check, reason or stage is each named."""
    catalog = reason_catalog()
    typo = Link("gpu", frozenset({"gemm", "gemmm"}), "single-node", frozenset({"bussy"}), True, frozenset({"slow"}))
    assert link_problems(typo, catalog) == [
        "link gpu -> ['gemm', 'gemmm'] (single-node): no check 'gemmm'",
        "link gpu -> ['gemm', 'gemmm'] (single-node): gpu declares no reason 'bussy'",
        "link gpu -> ['gemm', 'gemmm'] (single-node): no symptom check declares 'slow'",
    ]
    stray = Expectation("x", "single node", "hbm", lambda p: True, None, ("hbm",), frozenset({"probe_faild"}))
    assert expectation_problems(stray, catalog) == [
        "expectation 'x': no settling check declares 'probe_faild'",
        "expectation 'x': no stage 'single node'",
    ]


def test_every_stage_judges_what_its_own_plug_ins_declare() -> None:
    """Each stage answers the expectations and explains the findings of its own stage only: a declaration
    filed under another stage would never be judged there."""
    for stage in STAGES:
        assert {e.stage for e in stage.expectations()} <= {stage.name}, stage.name
        assert {link.stage for link in stage.causes()} <= {stage.name}, stage.name
