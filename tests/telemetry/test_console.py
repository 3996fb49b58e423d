"""The console's wording helpers."""


def test_a_count_and_its_noun_agree():
    from leantrain.telemetry.console import counted

    assert counted(1, "row") == "1 row"
    assert counted(2000, "row") == "2,000 rows"
    assert counted(0, "step") == "0 steps"
    assert (counted(1, "process", "processes"), counted(2, "process", "processes")) == ("1 process", "2 processes")
