"""Every name `import headsurgeon` advertises resolves (the README's API is real)."""
import headsurgeon as hs


def test_every_public_name_resolves():
    missing = []
    for name in hs.__all__:
        try:
            getattr(hs, name)
        except Exception as e:  # noqa: BLE001 - report them all at once
            missing.append(f"{name}: {type(e).__name__}: {e}")
    assert not missing, missing
