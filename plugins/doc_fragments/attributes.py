# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The modules' ``attributes``: what each attribute means, the platform (POSIX), and the read-only case.

    A module extends ``specdec.pivot.attributes`` (and ``specdec.pivot.attributes.read_only`` when it changes
    nothing) and writes only its own ``support`` and ``details``; its values win over the fragment's.
    """

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
"""

    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
    details:
      - Nothing changes, so there is no diff.
"""
