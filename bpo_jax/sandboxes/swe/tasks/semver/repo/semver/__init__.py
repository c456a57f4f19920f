from semver.version import compare, parse
from semver.select import latest, satisfies
