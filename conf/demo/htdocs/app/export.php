<?php
/* The expensive route of the demo (cost 10, plus its own "export" bucket):
 * a CSV export of made-up rows. */
header('Content-Type: text/csv');
echo "# decision=", getenv('TBUCKET_DECISION'),
     " remaining=", getenv('TBUCKET_REMAINING'), "\n";
echo "id,item,amount\n";
for ($i = 1; $i <= 5; $i++) {
    printf("%d,item-%d,%d.00\n", $i, $i, $i * 7);
}
