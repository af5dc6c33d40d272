<?php
/* The cheap route of the demo (cost 1): says what mod_tbucket decided. */
header('Content-Type: application/json');
echo json_encode(array(
    'route' => 'app',
    'decision' => getenv('TBUCKET_DECISION'),
    'remaining' => getenv('TBUCKET_REMAINING'),
    'time' => date('c'),
)), "\n";
