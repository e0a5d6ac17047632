"""The benchmark protocol's rules, one module each, called from everywhere they apply: which split gives the
agent feedback (`feedback`), which submission is the best and which is the final pick (`picking`), and what
counts as a mode breach (`breaches`). The grader, the run steps, the summary and the report import them; none
writes its own copy."""
