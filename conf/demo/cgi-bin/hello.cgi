#!/bin/sh
# A plain CGI script behind mod_tbucket: the decision is in its environment.
printf 'Content-Type: text/plain\r\n\r\n'
printf 'hello from CGI\n'
printf 'TBUCKET_DECISION=%s\n' "${TBUCKET_DECISION:-}"
printf 'TBUCKET_REMAINING=%s\n' "${TBUCKET_REMAINING:-}"
