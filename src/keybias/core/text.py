"""Characters that prose on a page and in a table share: one table of superscript digits, so
that 10⁻¹² is written the same way wherever a number is."""

SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")
